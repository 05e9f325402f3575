/* The GPU the CUDA backend runs on: its name, memory and peak rates (kiln_cuda_device_info),
 * for the trainer's memory plan and MFU. */
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_internal.cuh"
#include "kiln/core.h"

/* Dense rates of the parts kiln knows, from NVIDIA's data sheets (TFLOP/s): bf16/fp16 tensor
 * cores with fp32 accumulation, and fp32 on the CUDA cores. */
typedef struct known_gpu {
    int major, sms;
    const char *name_has, *name_also; /* substrings of the name (NULL: any) */
    double t16, t32;
    const char *what;
} known_gpu;

static const known_gpu KNOWN[] = {
    {9, 132, "NVL", NULL, 835.5, 60.0, "H100/H200 NVL data sheet"},
    {9, 132, "H200", NULL, 989.4, 66.9, "H200 SXM data sheet"},
    {9, 132, "H100", NULL, 989.4, 66.9, "H100 SXM data sheet"},
    {9, 132, "GH200", NULL, 989.4, 66.9, "GH200 data sheet"},
    {9, 114, "H100", NULL, 756.5, 51.2, "H100 PCIe data sheet"},
    {8, 108, "A100", NULL, 312.0, 19.5, "A100 data sheet"},
};

/* Per SM and clock: dense 16-bit tensor FLOPs with fp32 accumulation, and fp32 FLOPs. */
static void per_sm(int major, int minor, double *f16, double *f32, const char **note) {
    *note = "";
    if (major >= 10 && major < 12) {
        *f16 = 8192, *f32 = 256;
    } else if (major == 9) {
        *f16 = 4096, *f32 = 256;
    } else if (major == 8 && minor == 0) {
        *f16 = 2048, *f32 = 128;
    } else {
        *f16 = 1024, *f32 = 256;
        *note = " (the workstation parts' rate: GeForce cards accumulate in fp32 at half of it)";
    }
}

kiln_status kiln_cuda_device_info(kiln_cuda_info *info) {
    memset(info, 0, sizeof *info);
    kiln_status st = kiln_cuda_available(NULL, 0);
    if (st != KILN_OK)
        return st;
    int dev = 0, clk = 0;
    cudaDeviceProp p;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaGetDeviceProperties(&p, dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, dev);
    if (e == cudaSuccess) {
        size_t fr = 0, tot = 0;
        e = cudaMemGetInfo(&fr, &tot);
        info->mem_free = fr;
        info->mem_total = tot;
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        return kiln_error_setf(KILN_ERR_INTERNAL, "cannot read GPU %d's properties: %s", dev,
                               cudaGetErrorString(e));
    }
    snprintf(info->name, sizeof info->name, "%s", p.name);
    info->device = dev;
    info->major = p.major;
    info->minor = p.minor;
    info->sms = p.multiProcessorCount;
    info->clock_ghz = clk / 1e6; /* kHz */
    for (size_t i = 0; i < sizeof KNOWN / sizeof KNOWN[0]; i++) {
        const known_gpu *k = &KNOWN[i];
        if (k->major == p.major && k->sms == p.multiProcessorCount && strstr(p.name, k->name_has) &&
            (!k->name_also || strstr(p.name, k->name_also))) {
            info->peak_tflops_16 = k->t16;
            info->peak_tflops_32 = k->t32;
            snprintf(info->peak_source, sizeof info->peak_source, "%s", k->what);
            return KILN_OK;
        }
    }
    double f16, f32;
    const char *note;
    per_sm(p.major, p.minor, &f16, &f32, &note);
    info->peak_tflops_16 = info->sms * info->clock_ghz * f16 / 1e3;
    info->peak_tflops_32 = info->sms * info->clock_ghz * f32 / 1e3;
    snprintf(info->peak_source, sizeof info->peak_source,
             "%d SMs x %.2f GHz x %.0f (16-bit) or %.0f (fp32) FLOPs per SM and clock%s",
             info->sms, info->clock_ghz, f16, f32, note);
    return KILN_OK;
}
