/* checkpoint/ckpt_q8.h - checks of the quantized tensors of a checkpoint
 * (internal to checkpoint/; the format is checkpoint/ckpt_serve.h). */
#ifndef TANDEM_CHECKPOINT_CKPT_Q8_H
#define TANDEM_CHECKPOINT_CKPT_Q8_H

#include "checkpoint/ckpt_h5.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Dataset name (described by d, of type CKPT_H5_I8) of global shape
 * shape[ndim] is an int8 g32 tensor: attribute dtype "int8_g32", no
 * group_size other than 32, and name.scale float32 of shape shape[:-1] +
 * [ceil(K / 32)] (described into *scale).  0, or -1 with one line in err
 * naming the dataset. */
int ckpt_q8_check(hid_t f, const char *path, const char *name, int ndim, const size_t *shape, CkptH5Desc *scale,
                  char *err, size_t err_len);

/* Values of an int8 g32 box: q (n_rows x K) in [-127, 127], scales s
 * (n_rows x ceil(K / 32)) finite, >= 0, bfloat16 values (the GEMM holds
 * them in 16 bits), and 0 only for an all-zero group.
 * row0, rows, stacked: where the box starts, for the message (rows of one
 * matrix; stacked: an expert stack).  0, or -1 with one line in err naming
 * the dataset, row and group. */
int ckpt_q8_check_values(const char *path, const char *name, const int8_t *q, const float *s, size_t n_rows, size_t K,
                         size_t row0, size_t rows, bool stacked, char *err, size_t err_len);

/* Reads the box [off, off + cnt) of dataset name (described by d) as
 * float32 whatever it is stored as: float types upcast, int8 g32 checked
 * (ckpt_q8_check, ckpt_q8_check_values) and dequantized with name.scale,
 * q * s as the serving loader computes it (the box must then hold whole
 * rows).  0, or -1 with one line in err naming path and the dataset. */
int ckpt_read_box_f32(hid_t f, const char *path, const char *name, const CkptH5Desc *d, const hsize_t *off,
                      const hsize_t *cnt, float *out, char *err, size_t err_len);

/* The whole int8 g32 tensor name, checked: q (td_malloc'd, rows x K) and
 * its scales s (rows x ceil(K / 32)), rows = numel / K.  0, or -1 with one
 * line in err. */
int ckpt_read_q8_tensor(const char *path, const char *name, int8_t **q, float **s, size_t *rows, size_t *K,
                        char *err, size_t err_len);

#endif
