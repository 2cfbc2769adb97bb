/* checkpoint/ckpt_q8.h - checks of the quantized tensors of a checkpoint
 * (internal to checkpoint/; the format is checkpoint/ckpt_serve.h). */
#ifndef TANDEM_CHECKPOINT_CKPT_Q8_H
#define TANDEM_CHECKPOINT_CKPT_Q8_H

#include "checkpoint/ckpt_h5.h"

/* Dataset name (described by d, of type CKPT_H5_I8) of global shape
 * shape[ndim] is an int8 g32 tensor: attribute dtype "int8_g32", no
 * group_size other than 32, and name.scale float32 of shape shape[:-1] +
 * [ceil(K / 32)] (described into *scale).  0, or -1 with one line in err
 * naming the dataset. */
int ckpt_q8_check(hid_t f, const char *path, const char *name, int ndim, const size_t *shape, CkptH5Desc *scale,
                  char *err, size_t err_len);

#endif
