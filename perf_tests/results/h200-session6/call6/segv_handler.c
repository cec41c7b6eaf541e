#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <dlfcn.h>
static void handler(int sig, siginfo_t* info, void* ctx) {
  void* frames[64];
  int n = backtrace(frames, 64);
  char msg[128];
  int len = snprintf(msg, sizeof msg, "SIGSEGV at address %p, %d frames:\n", info->si_addr, n);
  write(2, msg, len);
  for (int i = 0; i < n; ++i) {
    Dl_info d;
    if (dladdr(frames[i], &d) && d.dli_fname) {
      len = snprintf(msg, sizeof msg, "#%d %s +0x%lx ", i, d.dli_fname, (unsigned long)((char*)frames[i] - (char*)d.dli_fbase));
      write(2, msg, len);
    }
    backtrace_symbols_fd(&frames[i], 1, 2);
  }
  _exit(139);
}
__attribute__((constructor)) static void install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = handler;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &sa, 0);
}
