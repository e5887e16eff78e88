/* show: `dflash-drafter show CHECKPOINT [--drafters N [--group]]`, a checkpoint's step and
 * training settings from its training state's metadata (no model, no backend), one "name value"
 * line each, for an operator and for the launchers (scripts/train, deploy/drafter-group) that
 * hand every drafter of a resumed run the same share of its step. With --drafters N it adds
 * "drafter_accumulate M", the slots each of N drafters trains a step when they resume it, as the
 * drafter's own resume decides (step_rescale.h; N > 1 or --group: a --group of --group-size N),
 * and "note TEXT" when the step is shared anew or changes (the line the drafter logs).
 * CHECKPOINT is a step-N directory or a checkpoint directory (its newest complete step-N).
 * Exit status: 0, 1 unreadable or malformed checkpoint, 2 bad arguments. */
#ifndef DFLASH_DRAFTER_SHOW_H
#define DFLASH_DRAFTER_SHOW_H

/* argv[0] is "show" */
int show_main(int argc, char **argv);

#endif
