#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>
/* On SIGSEGV: the registers, then every stack word that points into a loaded object's code
   (candidate return addresses), with the object, offset and nearest symbol. */
static void print_address(const char* what, unsigned long value) {
  Dl_info d;
  char msg[512];
  int len;
  if (value && dladdr((void*)value, &d) && d.dli_fname)
    len = snprintf(msg, sizeof msg, "%s 0x%lx %s +0x%lx %s\n", what, value, d.dli_fname,
                   value - (unsigned long)d.dli_fbase, d.dli_sname ? d.dli_sname : "?");
  else
    len = snprintf(msg, sizeof msg, "%s 0x%lx\n", what, value);
  write(2, msg, len);
}
static void handler(int sig, siginfo_t* info, void* context) {
  ucontext_t* uc = (ucontext_t*)context;
  unsigned long* rsp = (unsigned long*)uc->uc_mcontext.gregs[REG_RSP];
  char msg[128];
  int len = snprintf(msg, sizeof msg, "SIGSEGV at %p\n", info->si_addr);
  write(2, msg, len);
  print_address("rip", uc->uc_mcontext.gregs[REG_RIP]);
  print_address("rbp", uc->uc_mcontext.gregs[REG_RBP]);
  print_address("rsp", (unsigned long)rsp);
  print_address("rdi", uc->uc_mcontext.gregs[REG_RDI]);
  print_address("rsi", uc->uc_mcontext.gregs[REG_RSI]);
  print_address("rax", uc->uc_mcontext.gregs[REG_RAX]);
  for (int i = 0; i < 1024; ++i) {
    Dl_info d;
    unsigned long value = rsp[i];
    if (value > 0x10000 && dladdr((void*)value, &d) && d.dli_fname) {
      len = snprintf(msg, sizeof msg, "[rsp+%d]", 8 * i);
      print_address(msg, value);
    }
  }
  _exit(139);
}
__attribute__((constructor)) static void install(void) {
  static char stack[1 << 16];
  stack_t ss = {.ss_sp = stack, .ss_size = sizeof stack, .ss_flags = 0};
  sigaltstack(&ss, 0);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = handler;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &sa, 0);
}
