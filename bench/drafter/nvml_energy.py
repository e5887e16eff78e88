"""nvml_energy: the board's energy counter for the PyTorch benches of this folder, through NVML
by ctypes (as bench-drafter's energy.h reads it): nvml_energy(torch) returns (joules, limit_w),
joules() giving the counter in joules for the current CUDA device, or (None, 0.0) with a line
saying why where there is no NVML or no counter."""
import ctypes


def nvml_energy(torch):
    """A function giving the board's energy counter in joules (None without NVML) and the
    enforced power limit in watts."""
    try:
        nv = ctypes.CDLL("libnvidia-ml.so.1")
        assert nv.nvmlInit_v2() == 0
        bus = torch.cuda.get_device_properties(torch.cuda.current_device())
        pci = f"{bus.pci_domain_id:08x}:{bus.pci_bus_id:02x}:{bus.pci_device_id:02x}.0"
        h = ctypes.c_void_p()
        assert nv.nvmlDeviceGetHandleByPciBusId_v2(pci.encode(), ctypes.byref(h)) == 0
        mw = ctypes.c_uint()
        assert nv.nvmlDeviceGetEnforcedPowerLimit(h, ctypes.byref(mw)) == 0

        def joules():
            mj = ctypes.c_ulonglong()
            ok = nv.nvmlDeviceGetTotalEnergyConsumption(h, ctypes.byref(mj)) == 0
            return mj.value / 1000.0 if ok else None
        return joules if joules() is not None else None, mw.value / 1000.0
    except Exception as e:  # no driver library, no counter
        print(f"energy: no NVML energy counter ({type(e).__name__} {e})", flush=True)
        return None, 0.0
