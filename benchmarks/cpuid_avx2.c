/* An AVX2-only CPU, as the libraries see it, on a host with AVX-512 (`make bench-avx2`; LD_PRELOAD'ed into Python).
 *
 * ONNX Runtime, oneDNN, fbgemm, MKL and torch choose their kernels by what CPUID says. This library makes CPUID
 * fault in the process (Linux arch_prctl(ARCH_SET_CPUID, 0): CPUs with "cpuid_fault" in /proc/cpuinfo) and answers
 * each CPUID itself with the host's values less AVX-512, VNNI (AVX-512 and AVX), AVX-512 BF16/FP16 and AMX: the
 * feature set of an AMD EPYC Zen 3, the CPU of issue 13, whose targets are about AVX2-only machines. The code then
 * runs at the host's own speed (qemu's emulation of `make test-avx2` is exact about instructions but 10x slower,
 * useless for timing); the cores, caches and memory stay the host's, so this shows what the AVX2 kernels do, not
 * what a Zen 3 would measure.
 *
 * Only Python processes are masked (a compiler keeps its own SIGSEGV handler and the host's features); a SIGSEGV
 * handler the program installs later (Python's faulthandler) is chained behind ours, so real faults still reach it.
 */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

extern char *program_invocation_short_name;

typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
static sigaction_fn real_sigaction;
static struct sigaction next_handler; /* the program's own SIGSEGV disposition, run for every other fault */
static int active;

static void host_cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
    syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1);
    __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
    syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
}

static void mask(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
    if (leaf == 7 && sub == 0) {
        /* EBX: avx512f dq ifma pf er cd bw vl */
        r[1] &= ~((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | (1u << 28) | (1u << 30) | (1u << 31));
        /* ECX: avx512_vbmi, avx512_vbmi2, gfni, avx512_vnni, avx512_bitalg, avx512_vpopcntdq (Zen 3 has none) */
        r[2] &= ~((1u << 1) | (1u << 6) | (1u << 8) | (1u << 11) | (1u << 12) | (1u << 14));
        /* EDX: avx512_4vnniw, 4fmaps, vp2intersect, amx_bf16, avx512_fp16, amx_tile, amx_int8 */
        r[3] &= ~((1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | (1u << 24) | (1u << 25));
    } else if (leaf == 7 && sub == 1) {
        r[0] &= ~((1u << 4) | (1u << 5)); /* EAX: avx_vnni, avx512_bf16 */
    }
}

static void on_segv(int sig, siginfo_t *info, void *ctx) {
    greg_t *g = ((ucontext_t *)ctx)->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)g[REG_RIP];
    if (info->si_code == SI_KERNEL && ip[0] == 0x0f && ip[1] == 0xa2) { /* a CPUID that faulted */
        uint32_t r[4];
        host_cpuid((uint32_t)g[REG_RAX], (uint32_t)g[REG_RCX], r);
        mask((uint32_t)g[REG_RAX], (uint32_t)g[REG_RCX], r);
        g[REG_RAX] = r[0], g[REG_RBX] = r[1], g[REG_RCX] = r[2], g[REG_RDX] = r[3];
        g[REG_RIP] += 2;
        return;
    }
    if (next_handler.sa_flags & SA_SIGINFO) {
        next_handler.sa_sigaction(sig, info, ctx);
    } else if (next_handler.sa_handler != SIG_DFL && next_handler.sa_handler != SIG_IGN) {
        next_handler.sa_handler(sig);
    } else { /* default: die of the fault, as without this library */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        real_sigaction(SIGSEGV, &dfl, NULL);
    }
}

/* The program's sigaction: for SIGSEGV its handler is kept behind ours. */
int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    if (!real_sigaction)
        real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    if (!active || sig != SIGSEGV)
        return real_sigaction(sig, act, old);
    if (old)
        *old = next_handler;
    if (act)
        next_handler = *act;
    return 0;
}

__attribute__((constructor)) static void start(void) {
    real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    if (strncmp(program_invocation_short_name, "python", 6) != 0)
        return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    if (real_sigaction(SIGSEGV, &sa, &next_handler) != 0)
        return;
    if (syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0) != 0) { /* no CPUID faulting here: leave the process as it was */
        real_sigaction(SIGSEGV, &next_handler, NULL);
        return;
    }
    active = 1;
}
