/* main.c - the ckpt command: a table of subcommands, each in src/cmd_<name>.c. */
#include "cli.h"

#include <signal.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>

static const struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} commands[] = {
    {"inspect", cmd_inspect, "list every tensor (dtype, shape, stride, device, bytes) without loading data"},
    {"strip-module", cmd_strip_module, "remove the module. prefix of DataParallel/DDP from keys"},
    {"add-module", cmd_add_module, "add the module. prefix, for a DataParallel/DDP model"},
    {"unwrap", cmd_unwrap, "remove every wrapper component (module., _orig_mod., ...) from keys"},
    {"rename", cmd_rename, "rename keys with sed-style PCRE2 rules"},
    {"remap", cmd_remap, "rewrite the device tags of storages (cuda:1 -> cpu)"},
    {"extract", cmd_extract, "write one state dict (a pickled model's too) as a plain file"},
    {"convert", cmd_convert, "convert between pth, legacy pth and safetensors; cast dtypes"},
    {"diff", cmd_diff, "compare keys, shapes, dtypes and values of two checkpoints"},
    {"verify", cmd_verify, "load weights into a model (CPU or GPU) and check its outputs"},
    {"scan", cmd_scan, "list every global a file's pickles would import; flag unsafe ones"},
};

/* SIGINT, SIGTERM, SIGHUP: remove the temporary file of a write in progress
 * (the library's, when it has a name), then die of the signal as if there
 * were no handler, so that the caller sees the signal in the exit status. */
static void on_fatal_signal(int sig)
{
    ckpt_cleanup_temporaries();
    signal(sig, SIG_DFL);
    raise(sig); /* delivered when the handler returns (SIG is blocked in it) */
}

static void catch_fatal_signals(void)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
        struct sigaction sa, old;
        /* a signal ignored by whoever started us (nohup, `cmd &`) stays ignored */
        if (sigaction(sigs[i], NULL, &old) != 0 || old.sa_handler == SIG_IGN)
            continue;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_fatal_signal;
        sigfillset(&sa.sa_mask);
        sigaction(sigs[i], &sa, NULL);
    }
}

static void usage(FILE *out)
{
    fprintf(out, "usage: ckpt <command> [options] ...\n"
                 "       ckpt --version | -V | --help | -h | help [COMMAND]\n"
                 "       ckpt <command> --help | -h\n\n"
                 "Read PyTorch checkpoints safely, without Python: nothing in the file is run.\n\n"
                 "commands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(out, "  %-14s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\ncommon options (every command; scan admits no global, so no --allow-*):\n"
                 "  --allow-global M.NAME    admit this global as an opaque object (repeatable)\n"
                 "  --allow-unknown          admit every unknown global as an opaque object\n"
                 "  --max-pickle-bytes SIZE  refuse pickles larger than SIZE (default 1G)\n"
                 "  --max-header-bytes SIZE  refuse safetensors headers larger than SIZE\n"
                 "                           (default 100000000, as safetensors)\n"
                 "  --max-depth N            refuse values nested more than N levels (default 10000)\n"
                 "  -q, --quiet              print nothing but errors; the exit status tells\n"
                 "  -h, --help               the command's help (as 'ckpt help COMMAND')\n"
                 "inspect, diff, verify and scan also take -j, --json: one JSON document.\n"
                 "\nexit status: 0 ok, 1 difference or unsafe content found, 2 usage error,\n"
                 "3 malformed, unsupported or refused input, 4 I/O or system error.\n"
                 "See ckpt(1) and ckpt-<command>(1).\n");
}

static const struct command *find_command(const char *name)
{
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(name, commands[i].name) == 0)
            return &commands[i];
    return NULL;
}

static int not_a_command(const char *name)
{
    fprintf(stderr, "ckpt: '%s' is not a ckpt command (see 'ckpt --help')\n", cli_text(name));
    return CLI_EXIT_USAGE;
}

/* ckpt help [COMMAND]: the list of commands, or COMMAND's own --help text
 * (printed by the command itself, so the two never differ). */
static int help(int argc, char **argv)
{
    if (argc < 3) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    if (argc > 3) {
        fprintf(stderr, "ckpt: help: takes one COMMAND (see 'ckpt --help')\n");
        return CLI_EXIT_USAGE;
    }
    const struct command *c = find_command(argv[2]);
    if (!c)
        return not_a_command(argv[2]);
    static char help_option[] = "--help";
    char *args[] = {argv[2], help_option, NULL};
    optind = 0; /* glibc: full reset for the command's own getopt loop */
    return c->run(2, args);
}

int main(int argc, char **argv)
{
    /* libzip converts every record's DOS time with mktime(), and glibc then
     * checks /etc/localtime once per record unless TZ is set.  ckpt never
     * shows those times, so pin TZ and save a system call per record. */
    setenv("TZ", "UTC", 0);
    /* a file-size limit must be an error we report and clean up after, not a
     * signal that kills us with a partial file behind */
    signal(SIGXFSZ, SIG_IGN);
    /* an interrupted write leaves no temporary file behind */
    catch_fatal_signals();
    /* a sharded set keeps every shard open while it is read: a Hugging Face
     * model of over 1,000 shards must not stop at the usual soft limit of
     * 1,024 open files when the hard limit allows more */
    struct rlimit nofile;
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
        /* "unlimited" is refused (above fs.nr_open): its usual value then */
        nofile.rlim_cur = nofile.rlim_max == RLIM_INFINITY ? 1048576 : nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nofile);
    }

    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(name, "help") == 0)
        return help(argc, argv);
    if (strcmp(name, "--version") == 0 || strcmp(name, "-V") == 0) {
        /* the backends this run can use: one portable binary serves CPU-only
         * and GPU runners, so a CI log shows which one it got, and why not
         * CUDA */
        char cuda[700];
        int gpus = ckpt_cuda_module_describe(cuda, sizeof cuda);
        cli_printf("%s; backends: cpu%s%s%s\n", ckpt_version_details(),
                   gpus > 0 ? ", cuda (" : "; cuda not available: ", cuda, gpus > 0 ? ")" : "");
        return CLI_EXIT_OK;
    }
    const struct command *c = find_command(name);
    if (!c)
        return not_a_command(name);
    optind = 0; /* glibc: full reset for the command's own getopt loop */
    cli_begin(name, argc - 1, argv + 1);
    return cli_finish(c->run(argc - 1, argv + 1));
}
