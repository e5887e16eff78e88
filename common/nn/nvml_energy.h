/* nvml_energy: the board's energy counter and power limit through NVML, loaded at run time
 * (dlopen of the driver's libnvidia-ml.so.1: no build-time dependency, absent on a machine
 * without the driver). For ops_cuda.cu's start-up tuning (DFLASH_LT_TUNE_ENERGY=1): under the
 * board's power limit a product's time follows its energy, which a short timing on a cool board
 * does not show. */
#ifndef DFLASH_NN_NVML_ENERGY_H
#define DFLASH_NN_NVML_ENERGY_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nvml_energy nvml_energy;

/* The counter of the board of CUDA device `pci_bus_id` (cudaDeviceGetPCIBusId's string), or NULL
 * after logging why (no NVML, no such board, no counter). */
nvml_energy *nvml_energy_open(const char *pci_bus_id);
/* The board's energy since the driver loaded, in millijoules; < 0 on error. */
double nvml_energy_mj(nvml_energy *e);
/* The enforced power limit in watts. */
double nvml_energy_limit_w(const nvml_energy *e);
/* Accepts NULL; nulls *e. */
void nvml_energy_close(nvml_energy **e);

#ifdef __cplusplus
}
#endif

#endif
