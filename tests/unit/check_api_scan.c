/* check_api_scan.c - ckpt scan's engine through the public API
 * (ckpt_scan_paths, lib/analysis/scan_path.c): files, folders, DCP data
 * files, a missing file; each run gets the document `ckpt scan --json` prints
 * for the same paths, byte for byte, and its exit status; then what a
 * program reads from the entries directly. */
#include "unit.h"

#include <cjson/cJSON.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------------ */

/* What `ckpt scan FORMAT OPTS PATHS...` prints to stdout (FORMAT: "--json",
 * "--format sarif"), malloc'd; *STATUS its exit status.  Paths from
 * src_path() hold no quote. */
static char *cli_doc(const char *format, const char *opts, const char *const *paths, size_t n,
                     int *status)
{
    const char *ckpt = getenv("CKPT");
    size_t cap = 256 + strlen(opts);
    for (size_t i = 0; i < n; i++)
        cap += strlen(paths[i]) + 3;
    char *cmd = malloc(cap);
    ck_assert_ptr_nonnull(cmd);
    int len = snprintf(cmd, cap, "'%s' scan %s %s", ckpt ? ckpt : TOP_BUILDDIR "/ckpt", format,
                       opts);
    for (size_t i = 0; i < n; i++)
        len += snprintf(cmd + len, cap - (size_t)len, " '%s'", paths[i]);
    snprintf(cmd + len, cap - (size_t)len, " 2>/dev/null");
    FILE *fp = popen(cmd, "r");
    ck_assert_ptr_nonnull(fp);
    size_t size = 0, have = 0;
    char *out = NULL;
    for (;;) {
        if (have + 4096 + 1 > size) {
            size = (have + 4096 + 1) * 2;
            out = realloc(out, size);
            ck_assert_ptr_nonnull(out);
        }
        size_t got = fread(out + have, 1, 4096, fp);
        have += got;
        if (got == 0)
            break;
    }
    out[have] = '\0';
    int st = pclose(fp);
    ck_assert(WIFEXITED(st));
    *status = WEXITSTATUS(st);
    free(cmd);
    return out;
}

/* PATHS (relative to the source tree) made absolute, in a static table. */
static const char *const *src_paths(const char *const *rel, size_t n)
{
    static char buf[16][4096];
    static const char *out[16];
    ck_assert_uint_le(n, 16);
    for (size_t i = 0; i < n; i++) {
        snprintf(buf[i], sizeof buf[i], "%s", src_path(rel[i]));
        out[i] = buf[i];
    }
    return out;
}

/* A run over PATHS with the pickle limit LIMIT (0: the default). */
static ckpt_scan_paths *scan_paths(const char *const *paths, size_t n, uint64_t limit)
{
    ckpt_scan_paths *p = ckpt_scan_paths_new();
    ck_assert_ptr_nonnull(p);
    if (limit)
        ck_assert_int_eq(ckpt_scan_paths_set_limit(p, CKPT_LIMIT_PICKLE_BYTES, limit), CKPT_OK);
    for (size_t i = 0; i < n; i++)
        ck_assert_int_eq(ckpt_scan_paths_add(p, paths[i]), CKPT_OK);
    ck_assert_int_eq(ckpt_scan_paths_run(p), CKPT_OK);
    return p;
}

/* The engine's document (SARIF: its SARIF log) and exit status are the
 * CLI's for the same paths (OPTS: the CLI's options for the same LIMIT). */
static void same_doc(const char *const *rel, size_t n, uint64_t limit, const char *opts,
                     bool sarif)
{
    const char *const *paths = src_paths(rel, n);
    int status;
    char *want = cli_doc(sarif ? "--format sarif" : "--json", opts, paths, n, &status);
    ckpt_scan_paths *p = scan_paths(paths, n, limit);
    char *got = sarif ? ckpt_scan_paths_to_sarif(p) : ckpt_scan_paths_to_json(p);
    ck_assert_ptr_nonnull(got);
    /* the CLI puts() the document: one newline more */
    size_t at = 0;
    while (got[at] && got[at] == want[at])
        at++;
    ck_assert_msg(!got[at] && want[at] == '\n' && !want[at + 1],
                  "ckpt scan %s %s %s...: the engine's document differs at byte %zu: "
                  "\"%.80s\" where the CLI's has \"%.80s\"", sarif ? "--format sarif" : "--json",
                  opts, paths[0], at,
                  got + at, want + at);
    ck_assert_int_eq(ckpt_scan_paths_exit(p), status);
    free(got);
    free(want);
    ckpt_scan_paths_free(p);
}

static void same_as_cli(const char *const *rel, size_t n, uint64_t limit, const char *opts)
{
    same_doc(rel, n, limit, opts, false);
    same_doc(rel, n, limit, opts, true);
}

/* ---- the same answers as the CLI --------------------------------------------- */

START_TEST(test_cli_safe_files)
{
    const char *rel[] = {"tests/data/mlp.pth", "tests/data/legacy_mlp.pth",
                         "tests/data/train_ckpt.pth"};
    same_as_cli(rel, 3, 0, "");
}
END_TEST

/* every evasion of the scan corpus in one run: exit 1 */
START_TEST(test_cli_unsafe_files)
{
    const char *rel[] = {
        "tests/bad/scan/stack_global_memo.pkl", "tests/bad/scan/inst.pkl",
        "tests/bad/scan/obj.pkl", "tests/bad/scan/zip_extra_pkl.pth",
        "tests/bad/scan/frame_crossing_zip.pth", "tests/bad/scan/legacy_tar_polyglot.pth",
        "tests/bad/scan/safetensors_pickle.safetensors", "tests/bad/scan/computed_rot13.pkl",
        "tests/bad/scan/legacy_sysinfo.pth", "tests/bad/scan/protocol0.pkl",
        "tests/bad/os_system.pth", "tests/bad/zip/two_end_records.pth",
    };
    same_as_cli(rel, sizeof rel / sizeof *rel, 0, "");
}
END_TEST

START_TEST(test_cli_folders)
{
    const char *dcp[] = {"tests/fixtures/distributed/dcp/plain1"};
    same_as_cli(dcp, 1, 0, "");
    const char *zstd[] = {"tests/fixtures/distributed/dcp/zstd"};
    same_as_cli(zstd, 1, 0, "");
    const char *ds[] = {"tests/fixtures/distributed/deepspeed/zero2_fp32_2"};
    same_as_cli(ds, 1, 0, "");
}
END_TEST

/* unreadable (3) and missing (4) files among good ones: the worst wins */
START_TEST(test_cli_errors)
{
    const char *rel[] = {"tests/data/mlp.pth", "tests/bad/empty.pth",
                         "tests/bad/no_such_file.pth", "tests/bad/scan/obj.pkl",
                         "tests/bad/truncated_pickle.pth"};
    same_as_cli(rel, 5, 0, "");
    const char *limited[] = {"tests/data/mlp.pth"};
    same_as_cli(limited, 1, 100, "--max-pickle-bytes 100");
}
END_TEST

/* ---- the entries, read directly ------------------------------------------------ */

START_TEST(test_entry_safe)
{
    ckpt_scan_paths *p = scan_paths(src_paths((const char *[]){"tests/data/mlp.pth"}, 1), 1, 0);
    ck_assert_uint_eq(ckpt_scan_paths_count(p), 1);
    const ckpt_scan_entry *e = ckpt_scan_paths_entry(p, 0);
    ck_assert_int_eq(e->kind, CKPT_SCAN_ENTRY_FILE);
    ck_assert_str_eq(e->format, "pth-zip");
    ck_assert_str_eq(e->verdict, "safe");
    ck_assert_int_eq(e->exit, CKPT_SCAN_EXIT_SAFE);
    ck_assert_int_eq(e->code, CKPT_OK);
    ck_assert_ptr_null(e->error);
    /* the scan itself: the globals of a state dict */
    ck_assert_uint_eq(ckpt_scan_hit_count(e->scan), 3);
    const ckpt_scan_hit *h = ckpt_scan_hit_at(e->scan, 0);
    ck_assert_str_eq(h->global, "collections.OrderedDict");
    ck_assert_int_eq(h->cls, CKPT_GLOBAL_INTERPRETED);
    ck_assert_str_eq(h->used_by, "REDUCE");
    /* and what torch.load would say */
    ck_assert_ptr_nonnull(e->torch_load);
    ck_assert_int_eq(ckpt_torch_load_error_code(e->torch_load), CKPT_OK);
    ck_assert(ckpt_torch_load_verdict(e->torch_load, CKPT_TORCH_2_6)->accepted);
    ck_assert_int_eq(ckpt_scan_paths_exit(p), CKPT_SCAN_EXIT_SAFE);
    ck_assert_ptr_null(ckpt_scan_paths_entry(p, 1));
    ckpt_scan_paths_free(p);
}
END_TEST

START_TEST(test_entry_unsafe)
{
    const char *rel[] = {"tests/bad/scan/stack_global_memo.pkl"};
    ckpt_scan_paths *p = scan_paths(src_paths(rel, 1), 1, 0);
    const ckpt_scan_entry *e = ckpt_scan_paths_entry(p, 0);
    ck_assert_str_eq(e->format, "pickle");
    ck_assert_str_eq(e->verdict, "unsafe");
    ck_assert_int_eq(e->exit, CKPT_SCAN_EXIT_UNSAFE);
    ck_assert(ckpt_scan_unsafe(e->scan));
    const ckpt_scan_hit *h = ckpt_scan_hit_at(e->scan, 0);
    ck_assert_str_eq(h->global, "os.system");
    ck_assert(h->dangerous);
    ck_assert_uint_eq(h->uses, CKPT_SCAN_CALLED);
    ck_assert_int_eq(ckpt_scan_paths_exit(p), CKPT_SCAN_EXIT_UNSAFE);
    ckpt_scan_paths_free(p);
}
END_TEST

/* a missing file is an entry with its error; the run itself succeeds */
START_TEST(test_entry_missing)
{
    const char *rel[] = {"tests/data/mlp.pth", "tests/bad/no_such_file.pth", "tests/bad/empty.pth"};
    ckpt_scan_paths *p = scan_paths(src_paths(rel, 3), 3, 0);
    ck_assert_int_eq(ckpt_scan_paths_error_code(p), CKPT_OK);
    ck_assert_uint_eq(ckpt_scan_paths_count(p), 3);
    const ckpt_scan_entry *e = ckpt_scan_paths_entry(p, 1);
    ck_assert_int_eq(e->code, CKPT_ERR_IO);
    ck_assert_str_eq(e->error, "No such file or directory");
    ck_assert_str_eq(e->verdict, "error");
    ck_assert_int_eq(e->exit, CKPT_SCAN_EXIT_IO);
    /* torch.load's model cannot open it either, and says so the same way */
    ck_assert_int_eq(ckpt_torch_load_error_code(e->torch_load), CKPT_ERR_IO);
    ck_assert_str_eq(ckpt_torch_load_error_message(e->torch_load), "No such file or directory");
    e = ckpt_scan_paths_entry(p, 2);
    ck_assert_int_eq(e->code, CKPT_ERR_FORMAT);
    ck_assert_str_eq(e->error, "empty file");
    ck_assert_int_eq(e->exit, CKPT_SCAN_EXIT_UNREADABLE);
    ck_assert_int_eq(ckpt_scan_paths_exit(p), CKPT_SCAN_EXIT_IO); /* the worst */
    ckpt_scan_paths_free(p);
}
END_TEST

/* a folder's paths that are not scanned: a text file left out with its
 * reason (SKIPPED), a FIFO refused unread (REFUSED, 3), a protocol-0 pickle
 * scanned whatever its name; an empty folder is a FOLDER entry (3) */
START_TEST(test_entry_folder_kinds)
{
    char dir[] = "/tmp/ckpt-check-scan-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[4200];
    snprintf(path, sizeof path, "%s/README.md", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("# a model card\n", f);
    fclose(f);
    snprintf(path, sizeof path, "%s/notes.txt", dir); /* a protocol-0 pickle, by another name */
    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("cos\nsystem\n(S'true'\ntR.", f);
    fclose(f);
    snprintf(path, sizeof path, "%s/rank1.pt", dir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    const char *paths[] = {dir};
    ckpt_scan_paths *p = scan_paths(paths, 1, 0);
    ck_assert_uint_eq(ckpt_scan_paths_count(p), 3);
    const ckpt_scan_entry *e = ckpt_scan_paths_entry(p, 0);
    ck_assert_int_eq(e->kind, CKPT_SCAN_ENTRY_SKIPPED);
    ck_assert_ptr_nonnull(strstr(e->reason, "0x23 is no pickle opcode"));
    ck_assert_int_eq(e->exit, CKPT_SCAN_EXIT_SAFE);
    e = ckpt_scan_paths_entry(p, 1);
    ck_assert_int_eq(e->kind, CKPT_SCAN_ENTRY_FILE);
    ck_assert_str_eq(e->verdict, "unsafe");
    e = ckpt_scan_paths_entry(p, 2);
    ck_assert_int_eq(e->kind, CKPT_SCAN_ENTRY_REFUSED);
    ck_assert_str_eq(e->reason, "not a regular file (a FIFO): refused, never read");
    ck_assert_int_eq(e->exit, CKPT_SCAN_EXIT_UNREADABLE);
    ck_assert_int_eq(ckpt_scan_paths_exit(p), CKPT_SCAN_EXIT_UNSAFE); /* 1 whatever else */
    ckpt_scan_paths_free(p);
    unlink(path);
    snprintf(path, sizeof path, "%s/README.md", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/notes.txt", dir);
    unlink(path);
    p = scan_paths(paths, 1, 0);
    ck_assert_uint_eq(ckpt_scan_paths_count(p), 1);
    e = ckpt_scan_paths_entry(p, 0);
    ck_assert_int_eq(e->kind, CKPT_SCAN_ENTRY_FOLDER);
    ck_assert_int_eq(e->exit, CKPT_SCAN_EXIT_UNREADABLE);
    ck_assert_ptr_nonnull(strstr(e->reason, "no checkpoint in the folder"));
    ckpt_scan_paths_free(p);
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

/* a DCP folder: .metadata a pickle, each .distcp scanned item by item (no
 * torch.load verdicts: DCP's reader loads the items) */
START_TEST(test_entry_dcp_folder)
{
    const char *rel[] = {"tests/fixtures/distributed/dcp/plain1"};
    const char *const *paths = src_paths(rel, 1);
    ckpt_scan_paths *p = scan_paths(paths, 1, 0);
    ck_assert_uint_eq(ckpt_scan_paths_count(p), 2);
    char want[4200];
    snprintf(want, sizeof want, "%s/.metadata", paths[0]);
    const ckpt_scan_entry *e = ckpt_scan_paths_entry(p, 0);
    ck_assert_str_eq(e->path, want);
    ck_assert_str_eq(e->format, "pickle");
    ck_assert_ptr_nonnull(e->torch_load);
    e = ckpt_scan_paths_entry(p, 1);
    snprintf(want, sizeof want, "%s/__0_0.distcp", paths[0]);
    ck_assert_str_eq(e->path, want);
    ck_assert_str_eq(e->format, "dcp");
    ck_assert_ptr_null(e->torch_load);
    ck_assert_str_eq(ckpt_scan_pickle_name(e->scan, 0), "item at byte 0: archive/data.pkl");
    ck_assert_int_eq(ckpt_scan_paths_exit(p), CKPT_SCAN_EXIT_SAFE);
    ckpt_scan_paths_free(p);
}
END_TEST

/* a DeepSpeed folder: its `latest` (a tag name) is skipped, the rest scanned in path order */
START_TEST(test_entry_deepspeed_folder)
{
    const char *rel[] = {"tests/fixtures/distributed/deepspeed/zero2_fp32_2"};
    ckpt_scan_paths *p = scan_paths(src_paths(rel, 1), 1, 0);
    ck_assert_uint_eq(ckpt_scan_paths_count(p), 4);
    const char *last[] = {"mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                          "zero_pp_rank_1_mp_rank_00_optim_states.pt", "latest"};
    for (size_t i = 0; i < 4; i++) {
        const ckpt_scan_entry *e = ckpt_scan_paths_entry(p, i);
        ck_assert_str_eq(strrchr(e->path, '/') + 1, last[i]);
        ck_assert_int_eq(e->kind, i < 3 ? CKPT_SCAN_ENTRY_FILE : CKPT_SCAN_ENTRY_SKIPPED);
        ck_assert_int_eq(e->exit, CKPT_SCAN_EXIT_SAFE);
    }
    ck_assert_ptr_null(ckpt_scan_paths_entry(p, 3)->scan);
    ckpt_scan_paths_free(p);
}
END_TEST

/* without torch.load's verdicts: none in the entries, none in the document */
START_TEST(test_no_torch_load)
{
    ckpt_scan_paths *p = ckpt_scan_paths_new();
    ck_assert_int_eq(ckpt_scan_paths_set_torch_load(p, 0), CKPT_OK);
    ck_assert_int_eq(ckpt_scan_paths_add(p, src_path("tests/data/mlp.pth")), CKPT_OK);
    ck_assert_int_eq(ckpt_scan_paths_run(p), CKPT_OK);
    ck_assert_ptr_null(ckpt_scan_paths_entry(p, 0)->torch_load);
    char *doc = ckpt_scan_paths_to_json(p);
    ck_assert_ptr_nonnull(doc);
    ck_assert_ptr_null(strstr(doc, "torch_load"));
    ck_assert_ptr_nonnull(strstr(doc, "\"verdict\":\t\"safe\""));
    free(doc);
    /* a second run makes the entries again */
    ck_assert_int_eq(ckpt_scan_paths_run(p), CKPT_OK);
    ck_assert_uint_eq(ckpt_scan_paths_count(p), 1);
    ckpt_scan_paths_free(p);
}
END_TEST

/* ckpt_torch_load_to_json(): the torch_load object of the scan's document */
START_TEST(test_torch_load_json)
{
    const char *rel[] = {"tests/bad/scan/obj.pkl"};
    ckpt_scan_paths *p = scan_paths(src_paths(rel, 1), 1, 0);
    char *doc = ckpt_scan_paths_to_json(p);
    char *part = ckpt_torch_load_to_json(ckpt_scan_paths_entry(p, 0)->torch_load);
    ck_assert_ptr_nonnull(doc);
    ck_assert_ptr_nonnull(part);
    cJSON *d = cJSON_Parse(doc), *t = cJSON_Parse(part);
    cJSON *want = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(d, "files"), 0),
                                      "torch_load");
    ck_assert(cJSON_Compare(want, t, 1));
    ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(cJSON_GetObjectItem(t, "2.6+"), "accepted")));
    cJSON_Delete(d);
    cJSON_Delete(t);
    free(doc);
    free(part);
    ckpt_scan_paths_free(p);
}
END_TEST

/* The verdicts given the caller's own reading (ckpt_torch_load_use_file, as
 * inspect does: one model in memory) are the verdicts of a reading of its own. */
START_TEST(test_torch_load_use_file)
{
    const char *rel[] = {"tests/data/hf/gpt2_st_sharded/model-00001-of-00004.safetensors",
                         "tests/data/mlp.pth", "tests/data/legacy_mlp.pth",
                         "tests/data/torch2/whole_mlp.pt", "tests/data/tar/tar_state_dict.pth",
                         "tests/data/train_ckpt.pth"};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) {
        const char *path = src_path(rel[i]);
        ckpt_torch_load *own = ckpt_torch_load_new(), *lent = ckpt_torch_load_new();
        ckpt_file *f = ckpt_file_new();
        ck_assert_int_eq(ckpt_file_open(f, path), CKPT_OK);
        ck_assert_int_eq(ckpt_torch_load_check(own, path), CKPT_OK);
        ck_assert_int_eq(ckpt_torch_load_use_file(lent, f), CKPT_OK);
        ck_assert_int_eq(ckpt_torch_load_check(lent, path), CKPT_OK);
        char *a = ckpt_torch_load_to_json(own), *b = ckpt_torch_load_to_json(lent);
        ck_assert_ptr_nonnull(a);
        ck_assert_ptr_nonnull(b);
        ck_assert_msg(strcmp(a, b) == 0, "%s: own reading %s, lent reading %s", rel[i], a, b);
        free(a);
        free(b);
        ckpt_file_free(f);
        ckpt_torch_load_free(own);
        ckpt_torch_load_free(lent);
    }
    ckpt_torch_load *t = ckpt_torch_load_new();
    ckpt_file *unopened = ckpt_file_new();
    ck_assert_int_eq(ckpt_torch_load_use_file(t, unopened), CKPT_ERR_USAGE);
    ck_assert_int_eq(ckpt_torch_load_use_file(NULL, NULL), CKPT_ERR_USAGE);
    ckpt_file_free(unopened);
    ckpt_torch_load_free(t);
}
END_TEST

/* A hit's file_offset: the byte of the opcode that names the global, in the
 * file (a zip's stored record, a legacy stream, a DCP item); UINT64_MAX
 * where the pickle is not in the file as is (an item in a zstd frame). */
static void offsets_in_file(const char *rel, bool known)
{
    const char *const *paths = src_paths(&rel, 1);
    ckpt_scan_paths *p = scan_paths(paths, 1, 0);
    size_t hits = 0;
    for (size_t i = 0; i < ckpt_scan_paths_count(p); i++) {
        const ckpt_scan_entry *e = ckpt_scan_paths_entry(p, i);
        size_t len = strlen(e->path);
        if (e->kind != CKPT_SCAN_ENTRY_FILE ||
            (!known && (len < 7 || strcmp(e->path + len - 7, ".distcp") != 0)))
            continue; /* zstd frames: the data files' items, not the .metadata */
        FILE *fp = fopen(e->path, "rb");
        ck_assert_ptr_nonnull(fp);
        for (size_t k = 0; k < ckpt_scan_hit_count(e->scan); k++, hits++) {
            const ckpt_scan_hit *h = ckpt_scan_hit_at(e->scan, k);
            if (!known) {
                ck_assert_msg(h->file_offset == UINT64_MAX, "%s: %s at %llu of the file",
                              e->path, h->global, (unsigned long long)h->file_offset);
                continue;
            }
            ck_assert_msg(h->file_offset != UINT64_MAX && h->file_offset >= h->offset,
                          "%s: %s has no offset in the file", e->path, h->global);
            ck_assert_int_eq(fseek(fp, (long)h->file_offset, SEEK_SET), 0);
            int op = fgetc(fp);
            ck_assert_msg(strcmp(h->opcode, "GLOBAL") == 0 ? op == 'c'
                          : strcmp(h->opcode, "STACK_GLOBAL") == 0 ? op == 0x93 : op == 'i',
                          "%s: %s: byte %llu is 0x%02x, not %s", e->path, h->global,
                          (unsigned long long)h->file_offset, op, h->opcode);
        }
        fclose(fp);
    }
    ck_assert_uint_gt(hits, 0);
    ckpt_scan_paths_free(p);
}

START_TEST(test_hit_file_offset)
{
    offsets_in_file("tests/data/mlp.pth", true);
    offsets_in_file("tests/data/legacy_mlp.pth", true);
    offsets_in_file("tests/bad/scan/stack_global_memo.pkl", true);
    offsets_in_file("tests/bad/scan/legacy_tar_polyglot.pth", true);
    offsets_in_file("tests/fixtures/distributed/dcp/plain1", true);
    offsets_in_file("tests/fixtures/distributed/dcp/zstd", false);
}
END_TEST

START_TEST(test_usage)
{
    ckpt_scan_paths_free(NULL);
    ck_assert_int_eq(ckpt_scan_paths_run(NULL), CKPT_ERR_USAGE);
    ck_assert_int_eq(ckpt_scan_paths_error_code(NULL), CKPT_ERR_USAGE);
    ck_assert_int_eq(ckpt_torch_load_error_code(NULL), CKPT_ERR_USAGE);
    ckpt_scan_paths *p = ckpt_scan_paths_new();
    ck_assert_int_eq(ckpt_scan_paths_add(p, NULL), CKPT_ERR_USAGE);
    ck_assert_int_eq(ckpt_scan_paths_set_limit(p, CKPT_LIMIT_PICKLE_BYTES, 0), CKPT_ERR_USAGE);
    /* nothing added: nothing scanned, safe */
    ck_assert_int_eq(ckpt_scan_paths_run(p), CKPT_OK);
    ck_assert_uint_eq(ckpt_scan_paths_count(p), 0);
    ck_assert_int_eq(ckpt_scan_paths_exit(p), CKPT_SCAN_EXIT_SAFE);
    ckpt_scan_paths_free(p);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("api_scan");
    TCase *tc = tcase_create("scan_paths");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_cli_safe_files);
    tcase_add_test(tc, test_cli_unsafe_files);
    tcase_add_test(tc, test_cli_folders);
    tcase_add_test(tc, test_cli_errors);
    tcase_add_test(tc, test_entry_safe);
    tcase_add_test(tc, test_entry_unsafe);
    tcase_add_test(tc, test_entry_missing);
    tcase_add_test(tc, test_entry_folder_kinds);
    tcase_add_test(tc, test_entry_dcp_folder);
    tcase_add_test(tc, test_entry_deepspeed_folder);
    tcase_add_test(tc, test_no_torch_load);
    tcase_add_test(tc, test_torch_load_json);
    tcase_add_test(tc, test_torch_load_use_file);
    tcase_add_test(tc, test_hit_file_offset);
    tcase_add_test(tc, test_usage);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return unit_run(suite());
}
