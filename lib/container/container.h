/*
 * container/container.h - the zip container: reading records through libzip
 * (zip.c) and writing torch's aligned layout (zip_write.c).
 */
#ifndef CKPT_CONTAINER_H
#define CKPT_CONTAINER_H

#include "io/io.h"

typedef struct ckpt_zip ckpt_zip;

/* Open the zip archive FD (borrowed: it stays open while the archive is). */
int ckpt_zip_open(int fd, ckpt_zip **out, ckpt_error *err);
void ckpt_zip_close(ckpt_zip *z);
int64_t ckpt_zip_count(const ckpt_zip *z);
const char *ckpt_zip_name(const ckpt_zip *z, int64_t i);
/* Case-insensitive lookup as torch's miniz does; -1 when absent. */
int64_t ckpt_zip_find(const ckpt_zip *z, const char *name);
uint64_t ckpt_zip_size(const ckpt_zip *z, int64_t i);
uint32_t ckpt_zip_crc(const ckpt_zip *z, int64_t i);
/* False when the archive was written without CRC-32s (every record with
 * data has CRC 0, as torch's compute_crc32 off writes): reads then check
 * none.  One zero CRC among computed ones is checked, and fails. */
bool ckpt_zip_has_crcs(const ckpt_zip *z);
/* Record I's CRC-32 is not its data's: torch wrote 0 there on purpose (a
 * storage record of torch.serialization.skip_data, whose bytes come later).
 * Reads of it check no CRC from now on. */
void ckpt_zip_crc_unrecorded(ckpt_zip *z, int64_t i);
/* Whether reads of record I check its CRC-32. */
bool ckpt_zip_crc_checked(const ckpt_zip *z, int64_t i);
/* Read a whole record into a fresh malloc'd buffer (at most MAX bytes),
 * verifying its CRC-32. */
int ckpt_zip_read_all(ckpt_zip *z, int64_t i, uint64_t max, uint8_t **out,
                      size_t *len, ckpt_error *err);
/* Read [offset, offset+len) of a record.  When the range is the whole record
 * the CRC-32 is verified too. */
int ckpt_zip_read(ckpt_zip *z, int64_t i, uint64_t offset, void *buf, size_t len,
                  ckpt_error *err);

/* Read record I start to end, handing each chunk to SINK; the CRC-32 is
 * checked at the end (bounded memory, one pass even when deflated). */
int ckpt_zip_stream(ckpt_zip *z, int64_t i, int (*sink)(void *user, const uint8_t *p, size_t n),
                    void *user, ckpt_error *err);

/* File offset of a stored record's first data byte (from the central
 * directory and the local header); CKPT_ERR_UNSUPPORTED when compressed. */
int ckpt_zip_data_offset(ckpt_zip *z, int64_t i, uint64_t *offset, ckpt_error *err);
/* Whether record I's local header starts with its signature, which torch's
 * miniz checks when it extracts the record (libzip reads past a bad one). */
bool ckpt_zip_local_ok(ckpt_zip *z, int64_t i);
/* The same, as an error naming the record when it does not (CKPT_ERR_FORMAT). */
int ckpt_zip_local_check(ckpt_zip *z, int64_t i, ckpt_error *err);
/* Ask the kernel for every record's local header (posix_fadvise WILLNEED)
 * before they are checked one by one: a cold file's headers then come from
 * the disk together. */
void ckpt_zip_prefetch_locals(ckpt_zip *z);

/* The writer of torch's zip layout (zip_write.c). */
typedef struct ckpt_zipw ckpt_zipw;
ckpt_zipw *ckpt_zipw_new(int fd, ckpt_error *err);
void ckpt_zipw_free(ckpt_zipw *w);
/* Start record NAME of SIZE bytes: local header + FB padding; *data_at gets the
 * file offset where its data goes (a multiple of 64). */
int ckpt_zipw_begin(ckpt_zipw *w, const char *name, uint64_t size, uint64_t *data_at);
/* The file descriptor written to. */
int ckpt_zipw_fd(const ckpt_zipw *w);
/* Append data of the current record (pwrite at the cursor). */
int ckpt_zipw_write(ckpt_zipw *w, const void *p, size_t n);
/* Account for N data bytes placed at the cursor by someone else (copy_file_range). */
void ckpt_zipw_advance(ckpt_zipw *w, uint64_t n);
/* End the current record: its data descriptor. */
int ckpt_zipw_end(ckpt_zipw *w, uint32_t crc);
/* Central directory and end records. */
int ckpt_zipw_finish(ckpt_zipw *w);
/* The records begun so far: how many, and each one's name and CRC-32. */
size_t ckpt_zipw_count(const ckpt_zipw *w);
const char *ckpt_zipw_name(const ckpt_zipw *w, size_t i);
uint32_t ckpt_zipw_crc(const ckpt_zipw *w, size_t i);
/* Move the cursor: the next record begins at POS (an in-place rewrite). */
void ckpt_zipw_seek(ckpt_zipw *w, uint64_t pos);
/* Bytes a record of a NAME_LEN-byte name and SIZE data bytes takes when its
 * local header is at AT: header, padding to 64, data, descriptor. */
uint64_t ckpt_zipw_span(size_t name_len, uint64_t size, uint64_t at);
/* The central directory entry ckpt_zipw_finish writes for a record, into H
 * (CAP bytes); its length, 0 when it does not fit. */
size_t ckpt_zipw_central(uint8_t *h, size_t cap, const char *name, uint64_t offset,
                         uint64_t size, uint32_t crc);
/* The end records after a directory of COUNT entries, CD_SIZE bytes at
 * CD_START: zip64 end record, zip64 locator, end record (98 bytes). */
#define CKPT_ZIPW_ENDS 98
void ckpt_zipw_ends(uint8_t r[CKPT_ZIPW_ENDS], uint64_t count, uint64_t cd_start, uint64_t cd_size);

/* ---- replacing one record in place (zip_edit.c) -----------------------------
 * A zip laid out as torch.save writes it (end record last, no comment, the
 * directory right before the end records, no second end record near the
 * end) can have one record replaced by writing only that record, a new
 * directory and end records, never moving another record; the file is the
 * old archive or the new one to every reader at every instant (the steps
 * and why: lib/README.md, "In-place rewrites"). */
typedef struct ckpt_zip_layout ckpt_zip_layout;
/* The layout of FD's archive; CKPT_ERR_UNSUPPORTED, saying why, when it is
 * not one that can be edited so. */
int ckpt_zip_layout_read(int fd, ckpt_zip_layout **out, ckpt_error *err);
void ckpt_zip_layout_free(ckpt_zip_layout *l);
size_t ckpt_zip_layout_count(const ckpt_zip_layout *l);
const char *ckpt_zip_layout_name(const ckpt_zip_layout *l, size_t i);
uint64_t ckpt_zip_layout_size(const ckpt_zip_layout *l, size_t i);
uint32_t ckpt_zip_layout_crc(const ckpt_zip_layout *l, size_t i);
uint64_t ckpt_zip_layout_file_size(const ckpt_zip_layout *l);
/* Bytes before the directory that no record holds (left by in-place edits). */
uint64_t ckpt_zip_layout_dead(const ckpt_zip_layout *l);

typedef struct ckpt_zip_replace_result {
    uint64_t offset;          /* where the new record's local header went */
    uint64_t old_size, new_size;
    uint64_t dead;            /* dead bytes after the replacement */
    uint64_t written;         /* bytes written, the temporary copy included */
    bool direct;              /* the copy went with O_DIRECT */
    bool over_bound;          /* refused: DEAD would pass the bound */
} ckpt_zip_replace_result;
/* Replace record I of FD (laid out as L, read with the file locked) by the
 * LEN bytes DATA, under the same name.  When the dead bytes would pass
 * DEAD_MAX, CKPT_ERR_UNSUPPORTED with res->over_bound before anything is
 * written.  On an error before the switch the file is the old archive. */
int ckpt_zip_replace(int fd, ckpt_zip_layout *l, size_t i, const uint8_t *data, size_t len,
                     uint64_t dead_max, ckpt_zip_replace_result *res, ckpt_error *err);

/* Why a reader refuses the zip archive of the SIZE bytes from BASE of FD,
 * naming the field that is wrong: the end record, the zip64 end record and
 * its locator, each central directory entry's zip64 extra field, local
 * header offset and size.  ckpt_zip_why: false when none of these is wrong;
 * ckpt_zip_refusal: WHY holds its answer, else libzip's error code ZE in
 * words (never libzip's string for it: "No such file" for a zip64 field). */
bool ckpt_zip_why(int fd, uint64_t base, uint64_t size, char *why, size_t cap);
void ckpt_zip_refusal(int fd, uint64_t base, uint64_t size, int ze, char *why, size_t cap);

/* ---- the archive as each reader sees it (zip_dir.c) -------------------------
 * torch.load, Python's zipfile (scanners) and libzip (ckpt's other commands)
 * disagree on hostile zips: which end record, which of two equal names,
 * whether a CRC-32 matters.  ckpt_zip_dir_open models each; every point
 * where they could read different bytes is a finding (one sentence each).
 * Unreferenced bytes (dead space) are no finding unless they hold an end
 * record or a central directory entry. */
typedef enum {
    CKPT_ZIP_READER_TORCH,     /* miniz as torch builds it: no CRC-32 checks */
    CKPT_ZIP_READER_PYZIPFILE, /* Python 3.11's zipfile */
    CKPT_ZIP_READER_LIBZIP,
    CKPT_ZIP_READERS
} ckpt_zip_reader;

typedef struct {
    char *name;           /* the central directory's bytes, NUL added */
    size_t name_len;
    uint64_t cd_at;       /* its central directory entry */
    uint64_t header_at;   /* its local header, as the reader computes it */
    uint64_t data_at;     /* first data byte (from the local header); UINT64_MAX: no header */
    uint16_t method, flags;
    uint32_t crc;
    uint64_t csize, usize;
    /* the local header's view, for the disagreement findings */
    bool local_name_same;
    size_t local_name_len;
    uint16_t local_method, local_flags;
    uint32_t local_crc;
    uint64_t local_csize, local_usize;
} ckpt_zip_entry;

typedef struct ckpt_zip_dir ckpt_zip_dir;

/* Parse FD (SIZE bytes) as every reader does.  CKPT_ERR_FORMAT when no reader
 * takes it for a zip; a reader that refuses it while another reads it is a
 * finding. */
int ckpt_zip_dir_open(int fd, uint64_t size, ckpt_zip_dir **out, ckpt_error *err);
/* The same for a zip stored inside a larger file: the SIZE bytes from BASE
 * of FD (a DCP item).  Entries' offsets (header_at, data_at, cd_at) count
 * from BASE; ckpt_zip_dir_read adds it. */
int ckpt_zip_dir_open_at(int fd, uint64_t base, uint64_t size, ckpt_zip_dir **out,
                         ckpt_error *err);
/* Torch's reading alone (miniz: its end record, central directory, local
 * headers), none of the others' nor the findings: for a zip only torch's
 * reader reads (a DCP item, which torch.load reads from its bytes), where
 * searching a large window for stray end records would cost a read of it. */
int ckpt_zip_dir_open_torch(int fd, uint64_t base, uint64_t size, ckpt_zip_dir **out,
                            ckpt_error *err);
void ckpt_zip_dir_free(ckpt_zip_dir *d);
const char *ckpt_zip_reader_name(ckpt_zip_reader r);
size_t ckpt_zip_dir_finding_count(const ckpt_zip_dir *d);
const char *ckpt_zip_dir_finding(const ckpt_zip_dir *d, size_t i);
/* Whether reader R reads the archive at all; why not. */
bool ckpt_zip_dir_reads(const ckpt_zip_dir *d, ckpt_zip_reader r);
const char *ckpt_zip_dir_refusal(const ckpt_zip_dir *d, ckpt_zip_reader r);
/* torch.load takes a file for a zip only when it starts with a local header. */
bool ckpt_zip_dir_torch_sniffs(const ckpt_zip_dir *d);
/* The end record R uses (UINT64_MAX: libzip's is none of ours). */
uint64_t ckpt_zip_dir_end_at(const ckpt_zip_dir *d, ckpt_zip_reader r);
/* R's entries in central directory order. */
size_t ckpt_zip_dir_count(const ckpt_zip_dir *d, ckpt_zip_reader r);
const ckpt_zip_entry *ckpt_zip_dir_entry(const ckpt_zip_dir *d, ckpt_zip_reader r, size_t i);
/* The entry torch's getRecord(RECORD) reads ("data.pkl" -> "<first entry's
 * directory>/data.pkl"), by R's lookup rule: torch a case-blind binary search
 * over miniz's heap-sorted names, zipfile the last equal name, libzip the first.
 * -1 when absent. */
int64_t ckpt_zip_dir_find(const ckpt_zip_dir *d, ckpt_zip_reader r, const char *record);
/* Entry I's bytes as R gets them (stored, or inflated with zlib), at most CAP
 * bytes declared.  A CRC-32 mismatch fails nothing: *crc_ok says.  On a
 * truncated or corrupt record *out still holds the *len bytes there were
 * (the caller frees it) and the error is returned. */
int ckpt_zip_dir_read(const ckpt_zip_dir *d, int fd, ckpt_zip_reader r, size_t i, uint64_t cap,
                      uint8_t **out, size_t *len, bool *crc_ok, ckpt_error *err);
/* ---- the tar container of torch <= 0.1's checkpoints (tar.c), read as
 * Python 3.11's tarfile reads it for torch.load ------------------------- */
typedef struct ckpt_tar ckpt_tar;
typedef struct ckpt_tar_member {
    char *name;           /* as tarfile names it (PAX path, GNU long name, ustar
                           * prefix), NUL-terminated; may hold NULs: see name_len */
    size_t name_len;
    char type;            /* the typeflag byte ('0', '\0', '5', ...) */
    int64_t header_offset;
    int64_t data_offset;
    int64_t size;         /* may be negative or past the file: check before use */
    bool size_huge;       /* past int64 */
    bool regular;         /* extract() writes it as a file (regular or unknown type) */
} ckpt_tar_member;

/* Whether the first block HEAD[0..N) can start a tar that tarfile.open
 * accepts (a zero block or a header with a valid checksum): the quick test
 * before ckpt_tar_probe. */
bool ckpt_tar_head_ok(const uint8_t *head, size_t n);
/* Whether tarfile.open(fileobj=FD, mode='r:') succeeds on the file, so that
 * torch.load reads it as a tar and not as a pickle stream (an empty archive
 * included; a first header tarfile fails on with an error other than
 * TarError included too: torch.load then fails in the tar reader). */
bool ckpt_tar_probe(int fd, uint64_t size);
/* Every member, in order, as getmembers() lists them.  An error after the
 * first header: *FALLS_BACK (may be NULL) says whether it is a TarError,
 * on which torch.load reads the file as a pickle stream instead. */
int ckpt_tar_open(int fd, uint64_t size, ckpt_tar **out, bool *falls_back, ckpt_error *err);
void ckpt_tar_close(ckpt_tar *t);
size_t ckpt_tar_count(const ckpt_tar *t);
const ckpt_tar_member *ckpt_tar_member_at(const ckpt_tar *t, size_t i);
/* getmember(NAME): the last member of that name; NULL when none. */
const ckpt_tar_member *ckpt_tar_find(const ckpt_tar *t, const char *name);

#endif /* CKPT_CONTAINER_H */
