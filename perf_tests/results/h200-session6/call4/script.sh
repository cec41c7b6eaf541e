# Session 6, device call 4: a native backtrace of the odeint crash on CUDA (call 3).
set -u
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
tar -C /tmp -xzf .gpu/deps.tar.gz; python3 -c "import tarfile; tarfile.open('.gpu/torchlib.tar.xz').extractall('/tmp')"
export PARASEQ_TORCH_LIBRARY=/tmp/torchlib/libparaseq_torch.so PYTHONPATH=$PWD/python PARASEQ_TEST_DEVICES=cuda
T='python/tests/test_odeint.py::test_damped_oscillator_matches_the_closed_form'
which gdb && timeout 150 gdb -batch -ex run -ex bt -ex "info registers rip" --args python3 -m pytest -q -p no:cacheprovider "$T" > $OUT/gdb-odeint.txt 2>&1; echo "gdb rc=$?"; grep -A30 "SIGSEGV" $OUT/gdb-odeint.txt | head -40
timeout 100 python3 -m pytest -q -p no:cacheprovider -rfE python/tests/test_odeint.py -k "not dopri5" > $OUT/pytest-odeint-not-dopri5.txt 2>&1; echo "no dopri5 rc=$?"; tail -5 $OUT/pytest-odeint-not-dopri5.txt
