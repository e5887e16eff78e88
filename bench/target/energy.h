/* energy.h: the board's energy over a timed window, for the benches' rows (header-only;
 * bench-drafter includes it after cuda_runtime_api.h).
 *
 * Why: on the H200 the drafter step's products run at the board's 700 W limit, so a step's
 * time follows its energy (bench/cuda_ops/NOTES.md, "The products at the power limit"); a row
 * that gives joules per step and the mean power says how much of a change in time is a change
 * in energy. NVML's counter (millijoules since the driver loaded) is read through dlopen of the
 * driver's libnvidia-ml.so.1: no build-time dependency; without it the rows say "energy: n/a".
 * Over short windows the line is coarse: two runs of 10 steps (~1.2 s) on the H200 read 83.4 and
 * 76.4 J per step, runs of 40 steps 83.1-84.9 (bench-drafter's STEPS lengthens the window).
 * The four entry points are declared here from NVML's public C API (status 0 = success, an
 * opaque device handle, energy in mJ, the enforced power limit in mW).
 */
#ifndef DFLASH_BENCH_ENERGY_H
#define DFLASH_BENCH_ENERGY_H

#include <dlfcn.h>
#include <stdio.h>

typedef struct {
    void *dev;
    int (*energy)(void *, unsigned long long *);
    double limit_w;
} bench_energy;

/* The counter of CUDA device `device`'s board: 0, or -1 after saying why on stderr. */
static inline int bench_energy_open(bench_energy *e, int device) {
    e->dev = NULL, e->energy = NULL, e->limit_w = 0.0;
    char bus[32];
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, device) != cudaSuccess) return -1;
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "energy: %s\n", dlerror());
        return -1;
    }
    int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
    int (*by_pci)(const char *, void **) =
        (int (*)(const char *, void **))dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
    int (*energy)(void *, unsigned long long *) =
        (int (*)(void *, unsigned long long *))dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption");
    int (*limit)(void *, unsigned int *) =
        (int (*)(void *, unsigned int *))dlsym(lib, "nvmlDeviceGetEnforcedPowerLimit");
    unsigned long long mj = 0;
    unsigned int mw = 0;
    int rc = -1;
    if (!init || !by_pci || !energy || !limit || (rc = init()) != 0 ||
        (rc = by_pci(bus, &e->dev)) != 0 || (rc = energy(e->dev, &mj)) != 0 ||
        (rc = limit(e->dev, &mw)) != 0) {
        fprintf(stderr, "energy: no NVML energy counter for %s (status %d)\n", bus, rc);
        return -1; /* the library stays loaded: NVML may hold threads */
    }
    e->energy = energy, e->limit_w = mw / 1000.0;
    return 0;
}

/* The counter in joules, or a negative value without one */
static inline double bench_energy_j(const bench_energy *e) {
    unsigned long long mj = 0;
    if (!e->energy || e->energy(e->dev, &mj) != 0) return -1.0;
    return (double)mj / 1000.0;
}

/* Prints "energy: J per step, mean W (limit W)" for the window [j0, j1] of `steps` steps of
 * `sec` seconds each, or "energy: n/a". */
static inline void bench_energy_line(const bench_energy *e, double j0, double j1, int steps,
                                     double sec) {
    if (j0 < 0 || j1 < 0 || steps < 1 || sec <= 0)
        printf("energy: n/a\n");
    else
        printf("energy: %.2f J/step, %.0f W mean over the timed steps (board limit %.0f W)\n",
               (j1 - j0) / steps, (j1 - j0) / (steps * sec), e->limit_w);
}

#endif
