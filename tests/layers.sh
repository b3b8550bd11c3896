#!/bin/sh
# layers.sh - the layers of doc/design.md ("Layers"), checked on the
# sources (includes) and on the built objects (who references whom, by nm).
#
# Layers, bottom to top (a layer may use only the layers below it):
#   kernels/ (CUDA)  <  lib/core  <  lib/io  <  lib/container | lib/pickle
#     <  lib/checkpoint  <  lib/formats | lib/transform | lib/runtime
#     <  lib/analysis  <  src/
# Folders side by side ("|") must not use each other.  lib/ckpt.h (the public
# header) and config.h may be included by any file.
#
# Rules enforced (exit 1, one line per offence: file:line, what, target):
#  (a) includes: every #include "..." (and an #include <...> that resolves to
#      a file of this tree) in lib/**, src/**, kernels/**, resolved as the
#      compiler does (the including file's folder, then -I kernels for
#      kernels/, -I lib, -I top), must reach the same folder, a lower layer,
#      lib/ckpt.h or config.h.  Exceptions: src/ may include only src/*,
#      lib/ckpt.h and config.h; kernels/ may include only kernels/*,
#      lib/ckpt.h, lib/runtime/backend.h (the runtime's backend interface)
#      and config.h.  A lib/ folder missing from the table below is an
#      offence (keep the table true).
#  (b) no cycles: in the graph "object A has an undefined symbol that object
#      B defines" over lib/**/libckpt_core_la-*.o and kernels/*.o (when built),
#      no two files reach each other; each cycle is printed with the symbol
#      and line of every edge.
#  (c) no reference (call or data) goes from an object to an object of a
#      higher or side-by-side layer (same graph, mapped to folders);
#      kernels/ objects reference no lib/ object, and no lib/ object
#      references a kernels/ one: kernels/ is the CUDA module
#      (libckpt_cuda.so), which lib/runtime alone reaches, by dlopen and the
#      table of kernels/ckpt_cuda.h, the only kernels/ file it includes.
#  (d) in lib/formats/, a format module (each of FORMAT_STEMS: pth_zip*,
#      pth_legacy*, pth_tar*, safetensors*, sharded*, torchscript*, dcp*,
#      deepspeed*; another file: its stem before an optional _write) never
#      references (nor includes) another format module; the dispatch level (table.c, read.c, write.c, format.h) may.
#      A format helper (FORMAT_HELPERS: torch_zip.c, torch's zip reader that
#      the pth-zip and torchscript formats share) may be used by any format
#      module and uses none.
#  (e) containers are read by the formats alone: an object outside
#      lib/container, lib/formats and lib/checkpoint that references a
#      function of a container reader (CONTAINER_READERS: zip.c, zip_dir.c,
#      tar.c; not the writers zip_write.c and zip_edit.c) is "a second reader
#      of a container" (the analyses walk a file through its format's walk,
#      lib/formats/format.h).
#
# Exit: 0 clean, 1 offences, 77 (skip) when the objects are not built and the
# includes are clean (never under `make check`, which builds them first),
# 99 when the check itself cannot run (nm failing on a built object).
# Runs from the build directory; $srcdir is the top source directory.

top=${srcdir:-$(cd "$(dirname "$0")/.." && pwd)}
if ! command -v python3 >/dev/null 2>&1; then
    echo "layers: SKIP: python3 not found"
    exit 77
fi
exec python3 - "$top" "$(pwd)" "${NM:-nm}" <<'PY'
import glob, os, re, subprocess, sys

top, build, NM = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]), sys.argv[3]

# ---- the layer table --------------------------------------------------------
RANK = {'kernels': -1, 'core': 0, 'io': 1, 'container': 2, 'pickle': 2,
        'checkpoint': 3, 'formats': 4, 'transform': 4, 'runtime': 4, 'analysis': 5,
        'src': 6}
PUBLIC = {'lib/ckpt.h', 'config.h'}
KERNELS_MAY_INCLUDE = PUBLIC | {'lib/runtime/backend.h'}
FORMAT_STEMS = ('pth_zip', 'pth_legacy', 'pth_tar', 'safetensors', 'sharded', 'torchscript',
                'dcp', 'deepspeed')
FORMAT_DISPATCH = {'table', 'read', 'write', 'format'}
FORMAT_HELPERS = {'torch_zip'}
CONTAINER_READERS = {'lib/container/zip.c', 'lib/container/zip_dir.c', 'lib/container/tar.c'}
MAY_READ_CONTAINERS = {'container', 'formats', 'checkpoint'}


def folder(rel):
    """'lib/core/error.c' -> 'core'; 'src/x.c' -> 'src'; 'kernels/x.cu' ->
    'kernels'; 'lib/ckpt.h' -> 'public'; anything else -> None."""
    p = rel.split('/')
    if p[0] == 'lib':
        return 'public' if len(p) == 2 else p[1]
    if p[0] in ('src', 'kernels'):
        return p[0]
    return None


def shown(f):
    return f if f in ('src', 'kernels') else 'lib/' + f


def format_module(rel):
    p = rel.split('/')
    if len(p) != 3 or p[:2] != ['lib', 'formats']:
        return None
    stem = re.sub(r'\.[A-Za-z]+$', '', p[2])
    if stem in FORMAT_DISPATCH:
        return None
    if stem in FORMAT_HELPERS:
        return 'helper ' + stem
    for s in FORMAT_STEMS:
        if stem.startswith(s):           # pth_zip*.c, pth_legacy*.c, ...
            return s
    return re.sub(r'_write$', '', stem)


def judge(a, b, kind):
    """Why A may not use B (an include or a reference), or None."""
    if kind == 'include' and b in PUBLIC:
        return None
    fa, fb = folder(a), folder(b)
    if fb is None:
        return 'target is outside lib/, src/ and kernels/'
    for f in (fa, fb):
        if f not in RANK and f != 'public':
            return 'lib/%s is not in the layer table of tests/layers.sh' % f
    if fa == fb:
        ma, mb = format_module(a), format_module(b)
        if ma and mb and ma != mb and not mb.startswith('helper '):
            return 'format module %s may not use format module %s' % (ma, mb)
        return None
    if fa == 'src':
        return 'src/ may include only lib/ckpt.h, config.h and src/*'
    if fa == 'kernels':
        if kind == 'include' and b in KERNELS_MAY_INCLUDE:
            return None
        if kind == 'include':
            return 'kernels/ may include only lib/ckpt.h, lib/runtime/backend.h and config.h'
        return 'kernels/ (below lib/) may not use %s: goes up' % shown(fb)
    if fb == 'kernels':
        # the CUDA module, loaded with dlopen by lib/runtime/backend_cuda.c
        if kind != 'include':
            return 'kernels/ is the CUDA module, loaded at run time: no object links it'
        if fa != 'runtime':
            return 'only lib/runtime includes kernels/ (the CUDA module\'s table)'
        return None
    if fb == 'public':
        return None
    ra, rb = RANK[fa], RANK[fb]
    if rb < ra:
        return None
    how = 'side by side' if ra == rb else 'goes up'
    return '%s may not use %s: %s' % (shown(fa), shown(fb), how)


def tag(why):
    return 'format' if why.startswith('format module') else 'include'


violations = []   # printed lines, one per offence (a cycle: several lines)
nviol = 0


def offence(lines):
    global nviol
    nviol += 1
    violations.extend(lines if isinstance(lines, list) else [lines])


# ---- (a) includes -----------------------------------------------------------
def sources():
    out = []
    for root, exts in (('lib', ('.c', '.h')), ('src', ('.c', '.h')),
                       ('kernels', ('.c', '.h', '.cu', '.cuh'))):
        for dp, dns, fns in os.walk(os.path.join(top, root)):
            dns[:] = sorted(d for d in dns if not d.startswith('.'))
            for fn in sorted(fns):
                if fn.endswith(exts):
                    out.append(os.path.relpath(os.path.join(dp, fn), top))
    return out


def exists(rel):
    return os.path.isfile(os.path.join(top, rel)) or os.path.isfile(os.path.join(build, rel))


def resolve(src, name, quoted):
    dirs = [os.path.dirname(src)] if quoted else []
    if folder(src) == 'kernels':
        dirs.append('kernels')
    dirs += ['lib', '.']
    for d in dirs:
        p = os.path.normpath(os.path.join(d, name))
        if not p.startswith('..') and exists(p):
            return p
    return None


INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
files = sources()
nincludes = 0
for src in files:
    with open(os.path.join(top, src), encoding='utf-8', errors='replace') as fh:
        for n, line in enumerate(fh, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            quoted, name = m.group(1) == '"', m.group(2)
            # config.h is made by configure in the build directory
            tgt = 'config.h' if name == 'config.h' else resolve(src, name, quoted)
            if tgt is None:
                if quoted:
                    nincludes += 1
                    offence('%s:%d: [include] "%s": not found in the tree' % (src, n, name))
                continue          # <system header>
            nincludes += 1
            why = judge(src, tgt, 'include')
            if why:
                offence('%s:%d: [%s] "%s" -> %s: %s' % (src, n, tag(why), name, tgt, why))

# ---- the object graph -------------------------------------------------------
def objects():
    """{source rel path: object path}; stale objects (source gone) skipped."""
    found = {}
    for pattern, exts, prefix in (('lib/**/libckpt_core_la-*.o', ('.c',), 'libckpt_core_la-'),
                                  ('kernels/**/*.o', ('.cu', '.c'), '')):
        objs = [o for o in glob.glob(os.path.join(build, pattern), recursive=True)
                if '/.libs/' not in o]
        if not objs:   # --disable-static: only the PIC objects
            d, b = os.path.split(pattern)
            objs = glob.glob(os.path.join(build, d, '.libs', b), recursive=True)
        for o in sorted(objs):
            d = os.path.relpath(os.path.dirname(o), build)
            if os.path.basename(d) == '.libs':
                d = os.path.dirname(d)
            stem = os.path.basename(o)[len(prefix):-2]
            for e in exts:
                src = os.path.normpath(os.path.join(d, stem + e))
                if os.path.isfile(os.path.join(top, src)):
                    found[src] = o
                    break
            else:
                print('layers: note: %s has no source (stale object), ignored'
                      % os.path.relpath(o, build))
    return found


objs = objects()
if not objs:
    for v in violations:
        print(v)
    print('layers: %d files, %d includes, objects not built, %d violations'
          % (len(files), nincludes, nviol))
    if nviol:
        sys.exit(1)
    print('layers: SKIP: no lib/*/libckpt_core_la-*.o: build first (make)')
    sys.exit(77)

UNDEF = set('Uwv')


def nm(args, obj):
    try:
        return subprocess.run([NM] + args + [obj], check=True, capture_output=True,
                              text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        print('layers: ERROR: %s %s %s: %s' % (NM, ' '.join(args), obj, e))
        sys.exit(99)


defs, undefs = {}, {}
for src, o in objs.items():
    undefs[src] = set()
    for line in nm(['-P', '-g'], o).splitlines():
        p = line.split()
        if len(p) < 2:
            continue
        sym, t = p[0], p[1]
        if t in UNDEF:
            undefs[src].add(sym)
        elif t not in 'N':
            defs.setdefault(sym, set()).add(src)

edges = {}        # (a, b) -> sorted symbols
for a, us in undefs.items():
    for sym in us:
        for b in defs.get(sym, ()):
            if b != a:
                edges.setdefault((a, b), set()).add(sym)
succ = {s: sorted(b for (a, b) in edges if a == s) for s in objs}

_lines = {}


def where(src, sym):
    """'file:line' of SRC's reference to SYM (nm -l on the relocation, else the
    first mention in the source)."""
    if src not in _lines:
        m = {}
        for line in nm(['-l', '-u'], objs[src]).splitlines():
            p = line.split()
            if len(p) >= 3 and p[0] in UNDEF:
                f, _, n = p[2].rpartition(':')
                f = os.path.relpath(os.path.normpath(os.path.join(build, f)), top)
                loc = f + ':' + n
                # nvcc names its temporary files (tmpxft_*.cpp:0): not a place
                if n.isdigit() and int(n) > 0 and os.path.isfile(os.path.join(top, f)):
                    m[p[1]] = loc
        _lines[src] = m
    if sym in _lines[src]:
        return _lines[src][sym]
    word = re.compile(r'\b%s\b' % re.escape(sym))
    with open(os.path.join(top, src), encoding='utf-8', errors='replace') as fh:
        for n, line in enumerate(fh, 1):
            if word.search(line):
                return '%s:%d' % (src, n)
    return src + ':?'


def lineno(loc):
    try:
        return int(loc.rsplit(':', 1)[1])
    except ValueError:
        return 1 << 30


def refs(a, b):
    """SRC's references to B as (where, symbol), first line first."""
    return sorted(((where(a, s), s) for s in edges[(a, b)]), key=lambda r: (lineno(r[0]), r[1]))


# ---- (b) cycles: Tarjan's strongly connected components, then for each
# component shortest cycles until every member is on a printed one ----------
sys.setrecursionlimit(10000)
index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]


def strong(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in succ[v]:
        if w not in index:
            strong(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            sccs.append(sorted(comp))


for v in sorted(objs):
    if v not in index:
        strong(v)


def shortest_cycle(start, members):
    prev, todo = {start: None}, [start]
    while todo:
        nxt = []
        for v in todo:
            for w in succ[v]:
                if w not in members:
                    continue
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return list(reversed(path)) + [start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        todo = nxt
    return None


for comp in sorted(sccs):
    members, covered = set(comp), set()
    if len(comp) > 2:
        violations.append('%s: [cycle] a knot of %d files that all reach each other: %s; '
                          'cycles through all of them:' % (comp[0], len(comp), ', '.join(comp)))
    for v in comp:
        if v in covered:
            continue
        cyc = shortest_cycle(v, members)
        covered.update(cyc)
        lines = ['%s: [cycle] %s' % (cyc[0], ' -> '.join(cyc))]
        for a, b in zip(cyc, cyc[1:]):
            r = refs(a, b)
            more = ' (and %d more)' % (len(r) - 1) if len(r) > 1 else ''
            lines.append('    %s: %s -> %s%s' % (r[0][0], r[0][1], b, more))
        offence(lines)

# ---- (c) and (d): every reference judged ------------------------------------
for (a, b) in sorted(edges):
    why = judge(a, b, 'call')
    if why:
        for loc, sym in refs(a, b):
            offence('%s: [%s] %s -> %s: %s' % (loc, 'format' if tag(why) == 'format' else 'call',
                                                sym, b, why))

# ---- (e) no second reader of a container ------------------------------------
for (a, b) in sorted(edges):
    if b in CONTAINER_READERS and folder(a) not in MAY_READ_CONTAINERS:
        for loc, sym in refs(a, b):
            offence('%s: [reader] %s -> %s: a second reader of a container (only lib/formats/ '
                    'and lib/checkpoint/ read containers: walk the file through its format)'
                    % (loc, sym, b))

for v in violations:
    print(v)
print('layers: %d files, %d includes, %d objects, %d call edges checked, %d violations'
      % (len(files), nincludes, len(objs), len(edges), nviol))
sys.exit(1 if nviol else 0)
PY
