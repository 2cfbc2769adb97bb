/* checkpoint/ckpt_io.h - the chunk-level data path of the checkpoint module
 * (internal to checkpoint/).
 *
 * HDF5 keeps the metadata (datasets, attributes, the chunk index); the bulk
 * bytes move here, in parallel on the thread pool (core/pool.h):
 *
 *   writing (one process, whole tensors): each chunk is gathered from the
 *     tensor, converted to the storage type, zero-padded at the edges and
 *     given its Fletcher32 checksum by the pool, then stored with
 *     H5Dwrite_chunk (HDF5's direct chunk write: the filter pipeline is
 *     skipped because the chunk is already filtered);
 *   reading (every rank, its own hyperslabs): the chunks a box touches are
 *     located with H5Dget_chunk_info_by_coord, then read with pread by the
 *     pool threads (straight into the destination when the chunk is a
 *     contiguous part of it), checksummed and scattered.
 *
 * The bytes are exactly those HDF5's own pipeline writes and checks (the
 * Fletcher32 filter stores the checksum of the chunk's bytes after them,
 * little-endian), so h5py and h5dump read these files like any other.
 * Datasets the chunk path cannot serve (not chunked, other filters, a user
 * block, a chunk stored unfiltered) go through H5Dread instead.
 */
#ifndef TANDEM_CHECKPOINT_CKPT_IO_H
#define TANDEM_CHECKPOINT_CKPT_IO_H

#include "checkpoint/ckpt_h5.h"

/* The chunk path moves bytes without conversion: it serves the
 * little-endian hosts tandem runs on (the files are little-endian); a
 * big-endian host goes through HDF5's converting H5Dread / H5Dwrite. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define CKPT_IO_NATIVE 1
#else
#define CKPT_IO_NATIVE 0
#endif

/* HDF5's Fletcher32 of len bytes (big-endian 16-bit words, sums mod 65535
 * with HDF5's 0 / 0xffff convention), computed in blocks that vectorize. */
uint32_t ckpt_fletcher32(const void *p, size_t len);

/* State of one single-process save: chunk buffers reused across datasets
 * (owned; ckpt_io_scratch_free releases them, safe on a zeroed struct and
 * twice) and an fd of the file being written (borrowed, -1 for none): every
 * 64 MiB its dirty pages are handed to the disk (sync_file_range), so
 * writeback overlaps the rest of the save instead of waiting for fsync. */
typedef struct {
    unsigned char *buf;
    size_t bytes;
    int fd;
    size_t pending;          /* bytes written since the last kick */
    off_t started, dropped;  /* writeback started below / pages dropped below */
} CkptIoScratch;
void ckpt_io_scratch_free(CkptIoScratch *s);

/* Writes every chunk of dataset ds, just created with pc's shape, chunk
 * shape and type; pc->data holds the whole tensor (off 0, cnt = shape).
 * Main thread; uses the pool.  0, or -1 with the reason in err. */
int ckpt_io_write_chunks(hid_t ds, const CkptPiece *pc, CkptIoScratch *s, char *err, size_t err_len);

/* A batch of boxes to read from one file. */
typedef struct CkptIoRead CkptIoRead;

/* Opens path for the chunk reads (file: the same file open in HDF5). */
CkptIoRead *ckpt_io_read_new(const char *path, hid_t file, char *err, size_t err_len);
/* Queues box [off, off + cnt) of dataset name (described by d) into out
 * (float32 for float types, uint64 for U64; row-major box).  A dataset the
 * chunk path cannot serve is read at once with H5Dread.  0 or -1 with err. */
int ckpt_io_read_add(CkptIoRead *r, const char *name, const CkptH5Desc *d, const hsize_t *off, const hsize_t *cnt,
                     void *out, char *err, size_t err_len);
/* Reads every queued chunk (pool threads), verifies and scatters.  0, or -1
 * with the first failure in err ("dataset /x: checksum mismatch ..."). */
int ckpt_io_read_run(CkptIoRead *r, char *err, size_t err_len);
/* Closes and frees; safe with NULL. */
void ckpt_io_read_free(CkptIoRead *r);

#endif
