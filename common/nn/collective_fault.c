/* collective_fault: what a failed NCCL communicator init means for the group (collective_nccl.h,
 * dp_nccl_init_fault). Kept apart from collective_nccl.c, which needs nccl.h, so that the rule is
 * built, and unit-tested, in every build: it reads only NCCL's result number and its last error
 * text.
 *
 * The rule: ncclInvalidUsage at init means NCCL refused this rank's configuration. The known
 * case is two ranks of one communicator on one GPU (NCCL checks every pair of ranks at init and
 * answers "Duplicate GPU detected : rank %d and rank %d both on CUDA device %lx"; its user guide:
 * using one device as several ranks "is not supported"). Forming the group again gives the same
 * ranks the same GPUs and fails the same way, forever: the caller ends instead (DFLASH_ECONFIG).
 * A rank whose own GPU is unique sees its peers give up instead (an NCCL remote or system error,
 * or the timeout): that is a peer loss, and it re-forms without them (DFLASH_EPEER).
 * Pure function; any thread.
 */
#include "collective_nccl.h"

#include "err.h"

#include <stdio.h>
#include <string.h>

int dp_nccl_init_fault(int result, const char *last_error, int rank, int device, char *msg,
                       size_t len) {
    const char *text = last_error ? last_error : "";
    bool shared = strstr(text, "Duplicate GPU") != NULL;
    if (result != DP_NCCL_INVALID_USAGE && !shared) return DFLASH_EPEER;
    if (shared)
        err_fmt(msg, len, "NCCL refused the group: two of its ranks use one GPU (this rank %d is "
                "on --device %d; NCCL: %s). The nccl collective needs one GPU per rank: give "
                "each rank its own --device (an ordinal among the GPUs CUDA_VISIBLE_DEVICES "
                "leaves visible to it), or start every rank of the group with --comm shm",
                rank, device, text);
    else
        err_fmt(msg, len, "NCCL refused this rank's configuration (rank %d on --device %d: "
                "invalid usage%s%s); forming the group again would fail the same way. Check "
                "that each rank has its own GPU (--device), or use --comm shm on every rank",
                rank, device, text[0] ? ": " : "", text);
    return DFLASH_ECONFIG;
}
