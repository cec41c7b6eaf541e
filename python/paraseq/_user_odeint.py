"""odeint's general path: batched Runge-Kutta loops over a right-hand side of your own, in PyTorch.

The numerics are those of src/loops (tableaus.hpp, rk_step.hpp, integrate_kernels.hpp): the same
tableaus, the same RMS error norm over components of err / (atol + rtol max(|y|, |y_next|)), the
same PI controller (safety 0.9, factors 0.2 to 10, beta1 0.7 / k, beta2 0.4 / k with k the embedded
order + 1, no growth right after a rejection), the same accept rule (norm <= 1), Hairer's first
step, dense output for observations inside a step, and per-trajectory steps. Trajectories run in
lockstep over attempts; each has its own time, step size and status, so func must treat the rows
of y independently (as any per-trajectory right-hand side does).

The loops run inside the operator paraseq::user_odeint (a torch.library custom op with a fake
kernel): under torch.compile the whole integration is one node. Its backward,
paraseq::user_odeint_backward, runs the forward loop again recording the accepted steps (the
mesh, held fixed: the controller is not differentiated, as in src/loops) and reverses over them
with torch.func.vjp of one step over all N rows: memory is every trajectory's state at the start
of each attempt that one of them accepts, O(attempts x N x n),
plus one step's graph, never the graph of all steps.
"""

from __future__ import annotations

import contextlib
import math
from typing import List, Optional

import torch

from . import _user_function

# Butcher tableaus of src/loops/tableaus.hpp: c, a (strictly lower), b, b_hat, FSAL, embedded order.
_DOPRI5_A = [[], [0.2], [3 / 40, 9 / 40], [44 / 45, -56 / 15, 32 / 9],
             [19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729],
             [9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656],
             [35 / 384, 0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84]]
_TSIT5_A = [[], [0.161], [-0.0084806554923569885444268742502307746751, 0.33548065549235698854442687425023077468],
            [2.8971530571054934321304325941929387649, -6.3594484899750748431481599123838256260,
             4.3622954328695814110177273181908868610],
            [5.3258648284392566044288779208405113178, -11.748883564062827877747170339785772962,
             7.4955393428898362083046047845643581557, -0.092495066361755249256502079332071916113],
            [5.8614554429464200286592514869826478904, -12.920969317847109291706118681783359395,
             8.1593678985761586431804007945392534852, -0.071584973281400997224530542525829738691,
             -0.028269050394068382909003057212712241467],
            [0.096460766818065229518167313165128763337, 0.01, 0.47988965041449957477524953229059651991,
             1.3790085741037418931922748218568727708, -3.2900695154360806799010475857113638501,
             2.3247105240997739824153559183987657961]]
TABLEAUS = {
    "euler": dict(c=[0], a=[[]], b=[1], b_hat=None, fsal=False, embedded_order=0),
    "heun": dict(c=[0, 1], a=[[], [1]], b=[0.5, 0.5], b_hat=[1, 0], fsal=False, embedded_order=1),
    "rk4": dict(c=[0, 0.5, 0.5, 1], a=[[], [0.5], [0, 0.5], [0, 0, 1]], b=[1 / 6, 1 / 3, 1 / 3, 1 / 6], b_hat=None,
                fsal=False, embedded_order=0),
    "dopri5": dict(c=[0, 0.2, 0.3, 0.8, 8 / 9, 1, 1], a=_DOPRI5_A,
                   b=[35 / 384, 0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0],
                   b_hat=[5179 / 57600, 0, 7571 / 16695, 393 / 640, -92097 / 339200, 187 / 2100, 1 / 40],
                   fsal=True, embedded_order=4),
    "bosh3": dict(c=[0, 0.5, 0.75, 1], a=[[], [0.5], [0, 0.75], [2 / 9, 1 / 3, 4 / 9]], b=[2 / 9, 1 / 3, 4 / 9, 0],
                  b_hat=[7 / 24, 0.25, 1 / 3, 0.125], fsal=True, embedded_order=2),
    "tsit5": dict(c=[0, 0.161, 0.327, 0.9, 0.98002554090450968572981028628702459549, 1, 1], a=_TSIT5_A,
                  b=_TSIT5_A[6] + [0],
                  b_hat=[0.094680755765839458074788762557589228561, 0.0091835655403432530967763639366453137598,
                         0.48777052842476157078556425996312282415, 1.2342975669304789856551096738842376540,
                         -2.7077123499835254548811099750593216707, 1.8666284181705870357537193995662114987, 1 / 66],
                  fsal=True, embedded_order=4),
}
ADAPTIVE = ("heun", "bosh3", "dopri5", "tsit5")
SAFETY, MIN_FACTOR, MAX_FACTOR, BETA1, BETA2 = 0.9, 0.2, 10.0, 0.7, 0.4
LOG_ERROR_FLOOR = math.log(1e-4)  # a floor on the previous accepted error norm
STATUS = {1: "max_steps (the step budget ran out before t_end)",
          2: "step_too_small (the step size fell below min_step or no longer advances t)",
          3: "non_finite (a NaN or Inf appeared in the state or the error estimate)"}
RUNNING, SUCCESS, MAX_STEPS, STEP_TOO_SMALL, NON_FINITE = -1, 0, 1, 2, 3


def dense_weights(method, theta):
    """w_i(theta) of the method's dense output (theta [rows, 1]); w_i(1) = b_i."""
    x = theta
    if method == "heun":
        return [x - x * x / 2, x * x / 2]
    if method == "bosh3":  # the cubic Hermite interpolant (tableaus.hpp)
        return [x * (1 + x * (-4 / 3 + x * 5 / 9)), x * x * (1 - x * 2 / 3), x * x * (4 / 3 - x * 8 / 9),
                x * x * (x - 1)]
    if method == "tsit5":  # Tsitouras's fourth-order dense output (tableaus.hpp)
        x2 = x * x
        return [-1.0530884977290216 * x * (x - 1.3299890189751412) * (x2 - 1.4364028541716351 * x + 0.7139816917074209),
                0.1017 * x2 * (x2 - 2.1966568338249754 * x + 1.2949852507374631),
                2.490627285651252793 * x2 * (x2 - 2.38535645472061657 * x + 1.57803468208092486),
                -16.54810288924490272 * (x - 1.21712927295533244) * (x - 0.61620406037800089) * x2,
                47.37952196281928122 * (x - 1.203071208372362603) * (x - 0.658047292653547382) * x2,
                -34.87065786149660974 * (x - 1.2) * (x - 0.666666666666666667) * x2,
                2.5 * (x - 1) * (x - 0.6) * x2]
    # Shampine's fourth-order dense output of Dormand-Prince (tableaus.hpp), Horner form.
    return [x * (1 + x * (-8048581381 / 2820520608 + x * (8663915743 / 2820520608 + x * (-12715105075 / 11282082432)))),
            torch.zeros_like(x),
            x * x * (131558114200 / 32700410799 + x * (-68118460800 / 10900136933 + x * (87487479700 / 32700410799))),
            x * x * (-1754552775 / 470086768 + x * (14199869525 / 1410260304 + x * (-10690763975 / 1880347072))),
            x * x * (127303824393 / 49829197408
                     + x * (-318862633887 / 49829197408 + x * (701980252875 / 199316789632))),
            x * x * (-282668133 / 205662961 + x * (2019193451 / 616988883 + x * (-1453857185 / 822651844))),
            x * x * (40617522 / 29380423 + x * (-110615467 / 29380423 + x * (69997945 / 29380423)))]


def _combine(y, h, K, row):
    """y + h sum_j row_j K_j over the nonzero coefficients (numbers, or tensors as dense weights),
    in stage order: a number is add's alpha, and h multiplies in addcmul, one operation per term."""
    terms = [(w, k) for w, k in zip(row, K) if torch.is_tensor(w) or w != 0]
    if not terms:
        return y
    w, k = terms[0]
    total = k if not torch.is_tensor(w) and w == 1 else w * k
    for w, k in terms[1:]:
        total = total + w * k if torch.is_tensor(w) else torch.add(total, k, alpha=w)
    return torch.addcmul(y, h, total)


def stages(rhs, tableau, t, h, t_next, y, k_first):
    """(K, y_next) of one step from (t, y) with K_0 = k_first; t, h, t_next are [rows, 1]. Stages
    with c_i = 1 are evaluated at t_next. An FSAL method's last stage input is y_next."""
    K = [k_first]
    for i in range(1, len(tableau["c"])):
        Y = _combine(y, h, K, tableau["a"][i])
        c_i = tableau["c"][i]
        K.append(rhs(t_next if c_i == 1 else torch.add(t, h, alpha=c_i), Y))
    y_next = Y if tableau["fsal"] else _combine(y, h, K, tableau["b"])
    return K, y_next


def error_norm(tableau, h, y, y_next, K, rtol, atol, measured):
    """RMS over the first `measured` components of the error estimate over atol + rtol max(|y|,
    |y_next|): [rows]."""
    error = h * sum((b - b_hat) * k[:, :measured] for b, b_hat, k in zip(tableau["b"], tableau["b_hat"], K)
                    if b != b_hat)
    scale = atol + rtol * torch.maximum(y[:, :measured].abs(), y_next[:, :measured].abs())
    return (error / scale).square().mean(-1).sqrt()


def first_step_size(rhs, tableau, t0, t_end, y, k_first, rtol, atol, measured):
    """Hairer's starting step (Solving ODEs I, II.4) over the first `measured` components, per
    trajectory: [rows, 1]."""
    scale = atol + rtol * y[:, :measured].abs()
    rms = lambda v: (v[:, :measured] / scale).square().mean(-1, keepdim=True).sqrt()
    d0, d1 = rms(y), rms(k_first)
    span = t_end - t0
    h0 = torch.where((d0 < 1e-5) | (d1 < 1e-5), torch.full_like(d0, 1e-6), 0.01 * d0 / d1).clamp(max=span)
    f1 = rhs(t0 + h0, y + h0 * k_first)
    d2 = rms(f1 - k_first) / h0
    d_max = torch.maximum(d1, d2)
    h1 = torch.where(d_max <= 1e-15, torch.clamp(h0 * 1e-3, min=1e-6),
                     (0.01 / d_max).pow(1 / (tableau["embedded_order"] + 1)))
    h = torch.minimum(100 * h0, h1.clamp(max=span))
    return torch.where(torch.isfinite(h) & (h > 0), h, span)


# ---- the mesh of fixed steps (build_mesh in integrate.hpp) ----------------------------------------

def fixed_mesh(times, step_size):
    """(points, observation_point): the mesh points (float64) and each observation's point index.
    Steps of step_size from t[0] (a shorter last step lands on t[-1]; observations inside a step
    split it), or the grid t itself when step_size is None."""
    if step_size is None:
        return list(times), list(range(len(times)))
    t0, t_end = times[0], times[-1]
    ratio = (t_end - t0) / step_size
    nearest = round(ratio)
    steps = int(nearest if abs(ratio - nearest) <= 1e-9 * max(1.0, ratio) else math.ceil(ratio))
    grid = [t0 + k * step_size for k in range(steps)] + [t_end if steps > 0 else t0]
    span = grid[-1] - grid[0]
    near = lambda t, g: abs(t - g) <= 8 * 2.220446049250313e-16 * max(abs(g), span)
    points, observation_point, j = [], [0] * len(times), 0
    for g in grid:
        while j < len(times) and times[j] < g and not near(times[j], g):
            if times[j] != points[-1]:
                points.append(times[j])
            observation_point[j] = len(points) - 1
            j += 1
        points.append(g)
        while j < len(times) and (times[j] <= g or near(times[j], g)):
            observation_point[j] = len(points) - 1
            j += 1
    return points, observation_point


def _mesh_tensors(points, like):
    """Points and step lengths in the state's dtype (lengths as differences of the rounded points)."""
    p = torch.tensor(points, dtype=torch.float64).to(like.dtype).to(like.device)
    return p, p[1:] - p[:-1]


# ---- the loops -------------------------------------------------------------------------------------

def _raise_failures(status):
    failed = (status != SUCCESS).nonzero().flatten()
    if failed.numel():
        first = int(failed[0])
        raise RuntimeError(f"odeint: {failed.numel()} of {status.numel()} trajectories failed; the first, trajectory "
                           f"{first}, stopped with status {STATUS[int(status[first])]}")


def integrate_fixed(rhs, tableau, y0, times, step_size, record=None):
    """Observed states [len(t), N, n] over the fixed mesh; record(m, t, h, t_next, y) is called
    before each step m when given."""
    N = y0.shape[0]
    points, observation_point = fixed_mesh(times, step_size)
    p, lengths = _mesh_tensors(points, y0)
    observed = y0.new_empty((len(times), *y0.shape))
    at_point = {}
    for j, m in enumerate(observation_point):
        at_point.setdefault(m, []).append(j)
    y = y0
    k_first = None
    for m in range(len(points)):
        for j in at_point.get(m, ()):
            observed[j] = y
        if m + 1 == len(points):
            break
        t, h, t_next = (v.expand(N, 1) for v in (p[m], lengths[m], p[m + 1]))
        if record is not None:
            record(m, t, h, t_next, y)
        if k_first is None or not tableau["fsal"]:
            k_first = rhs(t, y)
        K, y = stages(rhs, tableau, t, h, t_next, y, k_first)
        k_first = K[-1]
    finite = torch.isfinite(observed).all(0).all(-1) & torch.isfinite(y).all(-1)
    _raise_failures(torch.where(finite, SUCCESS, NON_FINITE))
    return observed


def integrate_adaptive(rhs, tableau, method, y0, times, rtol, atol, max_steps, measured, record=None):
    """Observed states [len(t), N, n] with adaptive steps per trajectory; the step control measures
    the first `measured` components (the others are constants carried along). record(rows, t, h, t_new,
    y, observations) is called for every attempt that some trajectories accept, with every
    trajectory's t, h, t_new and y [N, ...] (rows: the indices of those that accept; observations:
    (j, rows, theta or None at the step's end) of what they observed)."""
    N, n = y0.shape
    dtype, device = y0.dtype, y0.device
    full = lambda value: torch.full((N, 1), value, dtype=dtype, device=device)
    t0, t_end = full(times[0]), full(times[-1])
    observation_times = torch.tensor(times, dtype=torch.float64).to(dtype).to(device)
    observed = y0.new_full((len(times), N, n), float("nan"))
    observed[0] = y0
    status = torch.where(torch.isfinite(y0).all(-1), RUNNING, NON_FINITE).to(device)
    if len(times) == 1:
        status = torch.where(status == RUNNING, SUCCESS, status)
        _raise_failures(status)
        return observed
    k = tableau["embedded_order"] + 1
    y, t = y0, t0
    k_first = rhs(t, y)
    h = first_step_size(rhs, tableau, t0, t_end, y, k_first, rtol, atol, measured)
    accepted = torch.zeros(N, dtype=torch.long, device=device)
    rejected = torch.zeros_like(accepted)
    next_observation = torch.ones_like(accepted)
    log_error_prev = torch.zeros(N, 1, dtype=dtype, device=device)
    last_rejected = torch.zeros(N, 1, dtype=torch.bool, device=device)
    nonfinite_attempt = torch.zeros(N, dtype=torch.bool, device=device)
    while True:
        running = status == RUNNING
        status = torch.where(running & (accepted + rejected >= max_steps), MAX_STEPS, status)
        lands = t + h >= t_end
        t_new = torch.where(lands, t_end, t + h)
        h_step = torch.where(lands, t_end - t, h)
        stuck = (status == RUNNING) & ((h < 0) | ~(t_new > t)).squeeze(-1)
        status = torch.where(stuck, torch.where(nonfinite_attempt, NON_FINITE, STEP_TOO_SMALL), status)
        running = status == RUNNING
        if not running.any():
            break
        K, y_new = stages(rhs, tableau, t, h_step, t_new, y, k_first)
        error = error_norm(tableau, h_step, y, y_new, K, rtol, atol, measured).unsqueeze(-1)
        finite = torch.isfinite(error) & torch.isfinite(y_new).all(-1, keepdim=True)
        accept = running.unsqueeze(-1) & finite & (error <= 1)
        reject = running.unsqueeze(-1) & ~accept
        log_error = torch.log(error)
        shrink = torch.where(finite, torch.clamp(SAFETY * torch.exp(-log_error / k), min=MIN_FACTOR),
                             torch.full_like(error, MIN_FACTOR))
        factor = torch.where(error == 0, torch.full_like(error, MAX_FACTOR),
                             SAFETY * torch.exp(BETA2 / k * log_error_prev - BETA1 / k * log_error))
        factor = factor.clamp(MIN_FACTOR, MAX_FACTOR)
        factor = torch.where(last_rejected, factor.clamp(max=1.0), factor)
        rows = accept.squeeze(-1).nonzero().flatten()
        observations = []
        if rows.numel():
            while True:  # observations at or before t_new, from the dense output of this step
                index = next_observation.clamp(max=len(times) - 1)
                pending = accept.squeeze(-1) & (next_observation < len(times)) & \
                    (observation_times[index] <= t_new.squeeze(-1))
                if not pending.any():
                    break
                when = observation_times[index].unsqueeze(-1)
                theta = (when - t) / h_step
                dense = _combine(y, h_step, K, dense_weights(method, theta))
                value = torch.where(when == t_new, y_new, dense)
                where = pending.nonzero().flatten()
                observed[index[where], where] = value[where]
                at_end = (when == t_new).squeeze(-1)[where]
                observations.append((index[where], where, torch.where(at_end.unsqueeze(-1), torch.nan,
                                                                      theta[where])))
                next_observation = next_observation + pending.long()
            if record is not None:
                record(rows, t, h_step, t_new, y, observations)
        h = torch.where(reject, h_step * shrink, torch.where(accept, h_step * factor, h))
        rejected = rejected + reject.squeeze(-1).long()
        last_rejected = torch.where(reject, True, torch.where(accept, False, last_rejected))
        nonfinite_attempt = torch.where(reject.squeeze(-1), ~finite.squeeze(-1),
                                        torch.where(accept.squeeze(-1), False, nonfinite_attempt))
        log_error_prev = torch.where(accept, torch.clamp(log_error, min=LOG_ERROR_FLOOR), log_error_prev)
        accepted = accepted + accept.squeeze(-1).long()
        y = torch.where(accept, y_new, y)
        t = torch.where(accept, t_new, t)
        if tableau["fsal"]:
            k_first = torch.where(accept, K[-1], k_first)
        elif rows.numel():
            k_first = torch.where(accept, rhs(t, y), k_first)
        status = torch.where(accept.squeeze(-1) & lands.squeeze(-1), SUCCESS, status)
    _raise_failures(status)
    return observed


# ---- the function as the loops call it -------------------------------------------------------------

def make_rhs(func, one_trajectory):
    """rhs(t [rows, 1], y [rows, n]) -> [rows, n] calling func, the registered function with its
    tensors substituted (_user_function.substituted), with y [n] and a 0-d t for one trajectory, as
    torchdiffeq does; checks what it returns."""
    def rhs(t, y):
        if one_trajectory:
            out = func(t.reshape(()), y.reshape(y.shape[-1]))
            expected = (y.shape[-1],)
        else:
            out = func(t, y)
            expected = tuple(y.shape)
        if not torch.is_tensor(out) or tuple(out.shape) != expected or out.dtype != y.dtype:
            given = f"shape {list(out.shape)} and dtype {out.dtype}" if torch.is_tensor(out) else \
                f"a {type(out).__name__}"
            raise ValueError(f"odeint: argument 'func' returned {given} from func(t, y), expected y's shape "
                             f"{list(expected)} and dtype {y.dtype}")
        return out.reshape(y.shape) if one_trajectory else out
    return rhs


@contextlib.contextmanager
def registered_rhs(token, tensors, one_trajectory):
    """make_rhs of the registered function with `tensors` substituted once, for the block."""
    with _user_function.substituted(_user_function.entry(token), tensors) as func:
        yield make_rhs(func, one_trajectory)


def _forward(token, y0, t, tensors, method, step_size, rtol, atol, max_steps, one_trajectory, measured, record=None):
    """The integration, with the operator's tensors in func for all of it (substituted once)."""
    times = t.tolist()
    tableau = TABLEAUS[method]
    with registered_rhs(token, tensors, one_trajectory) as rhs:
        if step_size is None and method in ADAPTIVE:
            return integrate_adaptive(rhs, tableau, method, y0, times, rtol, atol, max_steps, measured, record)
        return integrate_fixed(rhs, tableau, y0, times, step_size, record)


@torch.library.custom_op("paraseq::user_odeint", mutates_args=())
def user_odeint(token: int, y0: torch.Tensor, t: torch.Tensor, tensors: List[torch.Tensor], method: str,
                step_size: Optional[float], rtol: float, atol: float, max_steps: int, one_trajectory: bool,
                measured: int) -> torch.Tensor:
    """measured: how many leading components of the state the step control measures (y0's n for a
    function of your own; a built-in field's n, its per-trajectory parameters riding behind it)."""
    with torch.no_grad():
        return _forward(token, y0, t, tensors, method, step_size, rtol, atol, max_steps, one_trajectory, measured)


@user_odeint.register_fake
def _user_odeint_fake(token, y0, t, tensors, method, step_size, rtol, atol, max_steps, one_trajectory, measured):
    return y0.new_empty((t.shape[0], *y0.shape))


def _step_vjp(token, tensors, one_trajectory, tableau, t, h, t_next, y, grad_y_next, grad_stages):
    """(dL/dy, dL/dtensors) of one step from y given dL/dy_next and dL/dK_i (dense outputs)."""
    def step(y, *tensors):
        with registered_rhs(token, list(tensors), one_trajectory) as rhs:
            K, y_next = stages(rhs, tableau, t, h, t_next, y, rhs(t, y))
        return y_next, torch.stack(K)

    _, pullback = torch.func.vjp(step, y, *tensors)
    return pullback((grad_y_next, grad_stages))


@torch.library.custom_op("paraseq::user_odeint_backward", mutates_args=())
def user_odeint_backward(token: int, y0: torch.Tensor, t: torch.Tensor, tensors: List[torch.Tensor], method: str,
                         step_size: Optional[float], rtol: float, atol: float, max_steps: int, one_trajectory: bool,
                         measured: int, grad: torch.Tensor) -> List[torch.Tensor]:
    """[dL/dy0] + [dL/dtensor for each tensor], the discrete adjoint over the steps taken."""
    tableau = TABLEAUS[method]
    steps = []
    with torch.no_grad():
        _forward(token, y0, t, tensors, method, step_size, rtol, atol, max_steps, one_trajectory, measured,
                 record=lambda *step: steps.append(step))
    grad_tensors = [torch.zeros_like(x) for x in tensors]
    S = len(tableau["c"])
    adaptive = step_size is None and method in ADAPTIVE
    if adaptive:
        adjoint = torch.zeros_like(y0)  # dL/dy at each trajectory's current step end
        # Every attempt is reversed over all N rows, as the forward evaluated func: a function may
        # hold per-trajectory tensors [N, ...]. The rows that did not accept it take a step of
        # length 0, which is the identity (its pullback passes dL/dy on and adds nothing).
        for rows, t_start, h, t_new, y, observations in reversed(steps):
            took = torch.zeros_like(h, dtype=torch.bool)
            took[rows] = True
            h = torch.where(took, h, torch.zeros_like(h))
            t_new = torch.where(took, t_new, t_start)
            grad_y = torch.zeros_like(y)
            grad_stages = y.new_zeros((S, *y.shape))
            for index, where, theta in observations:
                g = grad[index, where]
                at_end = torch.isnan(theta).squeeze(-1)
                adjoint[where[at_end]] += g[at_end]
                inside = ~at_end
                if inside.any():
                    observing = where[inside]
                    grad_y[observing] += g[inside]
                    weights = dense_weights(method, theta[inside])
                    for i, w in enumerate(weights):
                        grad_stages[i, observing] += h[observing] * w * g[inside]
            bars = _step_vjp(token, tensors, one_trajectory, tableau, t_start, h, t_new, y, adjoint, grad_stages)
            adjoint = bars[0] + grad_y
            grad_tensors = [a + b for a, b in zip(grad_tensors, bars[1:])]
        return [adjoint + grad[0]] + grad_tensors
    points, observation_point = fixed_mesh(t.tolist(), step_size)
    adjoint = torch.zeros_like(y0)
    at_point = {}
    for j, m in enumerate(observation_point):
        at_point.setdefault(m, []).append(j)
    for m, t_start, h, t_next, y in reversed(steps):
        for j in at_point.get(m + 1, ()):
            adjoint = adjoint + grad[j]
        bars = _step_vjp(token, tensors, one_trajectory, tableau, t_start, h, t_next, y, adjoint,
                         y.new_zeros((S, *y.shape)))
        adjoint = bars[0]
        grad_tensors = [a + b for a, b in zip(grad_tensors, bars[1:])]
    for j in at_point.get(0, ()):
        adjoint = adjoint + grad[j]
    return [adjoint] + grad_tensors


@user_odeint_backward.register_fake
def _user_odeint_backward_fake(token, y0, t, tensors, method, step_size, rtol, atol, max_steps, one_trajectory,
                               measured, grad):
    return [torch.empty_like(y0)] + [torch.empty_like(x) for x in tensors]


def _setup_context(ctx, inputs, output):
    token, y0, t, tensors, method, step_size, rtol, atol, max_steps, one_trajectory, measured = inputs
    ctx.save_for_backward(y0, t, *tensors)
    ctx.settings = (token, method, step_size, rtol, atol, max_steps, one_trajectory, measured)
    if not torch.compiler.is_compiling():  # eager: the graph keeps the function alive for the backward
        ctx.function = _user_function.entry(token).callable()


def _backward(ctx, grad):
    y0, t, *tensors = ctx.saved_tensors
    token, method, step_size, rtol, atol, max_steps, one_trajectory, measured = ctx.settings
    grads = user_odeint_backward(token, y0, t, tensors, method, step_size, rtol, atol, max_steps, one_trajectory,
                                 measured, grad.contiguous())
    return None, grads[0], None, grads[1:], None, None, None, None, None, None, None


user_odeint.register_autograd(_backward, setup_context=_setup_context)


def _refuse_double_backward(ctx, *grads):
    raise NotImplementedError("paraseq.odeint does not support double backward: the gradient of an integration of a "
                              "function of your own is not differentiable (Hessians, gradgradcheck, a second "
                              "backward through create_graph=True); integrate with a loop of your own for those")


user_odeint_backward.register_autograd(_refuse_double_backward, setup_context=lambda ctx, inputs, output: None)
