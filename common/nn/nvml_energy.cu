/* nvml_energy: NVML's energy counter by dlopen (nvml_energy.h). The four entry points used are
 * declared here from NVML's public API: return codes (0 = success), an opaque device handle,
 * energy in millijoules, power limit in milliwatts. Host code only. */
#include "nvml_energy.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int (*nvml_init_fn)(void);
typedef int (*nvml_by_pci_fn)(const char *, void **);
typedef int (*nvml_energy_fn)(void *, unsigned long long *);
typedef int (*nvml_limit_fn)(void *, unsigned int *);

struct nvml_energy {
    void *dev;
    nvml_energy_fn energy;
    double limit_w;
};

extern "C" nvml_energy *nvml_energy_open(const char *pci_bus_id) {
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "nvml_energy: %s\n", dlerror());
        return NULL;
    }
    nvml_init_fn init = (nvml_init_fn)dlsym(lib, "nvmlInit_v2");
    nvml_by_pci_fn by_pci = (nvml_by_pci_fn)dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
    nvml_energy_fn energy = (nvml_energy_fn)dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption");
    nvml_limit_fn limit = (nvml_limit_fn)dlsym(lib, "nvmlDeviceGetEnforcedPowerLimit");
    void *dev = NULL;
    unsigned long long mj = 0;
    unsigned int mw = 0;
    int rc = -1;
    if (!init || !by_pci || !energy || !limit || (rc = init()) != 0 ||
        (rc = by_pci(pci_bus_id, &dev)) != 0 || (rc = energy(dev, &mj)) != 0 ||
        (rc = limit(dev, &mw)) != 0 || mw == 0) {
        fprintf(stderr, "nvml_energy: no energy counter for %s (NVML status %d)\n", pci_bus_id,
                rc);
        return NULL; /* the library stays loaded (never closed: NVML may hold threads) */
    }
    nvml_energy *e = (nvml_energy *)calloc(1, sizeof *e);
    if (!e) return NULL;
    e->dev = dev, e->energy = energy, e->limit_w = mw / 1000.0;
    return e;
}

extern "C" double nvml_energy_mj(nvml_energy *e) {
    unsigned long long mj = 0;
    return e->energy(e->dev, &mj) == 0 ? (double)mj : -1.0;
}

extern "C" double nvml_energy_limit_w(const nvml_energy *e) {
    return e->limit_w;
}

extern "C" void nvml_energy_close(nvml_energy **e) {
    if (!e || !*e) return;
    free(*e); /* NVML stays loaded and initialised: other users in the process may share it */
    *e = NULL;
}
