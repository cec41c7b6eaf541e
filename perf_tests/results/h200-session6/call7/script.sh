# Session 6, device call 7: test_rk_adaptive's new caller-workspace test alone on CUDA and Serial
# (the adapter's path; sources of the head, built on the workstation into their own binary).
set -u
tar -C /tmp -xzf .gpu/deps.tar.gz; tar -C /tmp -xzf .gpu/ws.tar.gz; tar -C /tmp -xzf .gpu/segv.tar.gz
LD_PRELOAD=/tmp/segv/libsegv.so timeout 100 /tmp/ws/ws_tests > $OUT/test-caller-workspace.txt 2>&1; echo "rc=$?"; cat $OUT/test-caller-workspace.txt | cut -c1-200 | tail -30
