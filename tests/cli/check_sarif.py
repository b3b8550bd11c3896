"""check_sarif.py SARIF JSON SRCDIR: ckpt scan --format sarif's log (SARIF)
against ckpt scan --json's document of the same files (JSON), for
tests/cli/scan_sarif.sh.  Prints one line per check ("ok: ..." or
"FAIL: ..."), and "SKIP: ..." for the schema when jsonschema is absent;
exits 1 when a check failed.

- the log validates against the SARIF 2.1.0 schema (tests/schemas/);
- one result per finding the JSON lists: each global neither interpreted
  nor known data (error), each TorchScript code finding (error), each
  ambiguity (warning), each unread name outside a folder (error); the same
  globals, pickles and offsets;
- where a result gives a byte in the file, the file holds the opcode that
  names the global there, and its line and column are that byte's (lines
  counted by the newline bytes before it, columns in bytes);
- one notification per file that could not be read (exit 3 or 4) and per
  skipped file, and executionSuccessful false exactly then;
- each location's URI is the path, percent-encoded.
"""
import json
import os
import sys
import urllib.parse

sarif_path, json_path, srcdir = sys.argv[1:4]
failures = 0


def check(what, cond):
    global failures
    print(("   ok: " if cond else "FAIL: ") + what)
    failures += not cond


def load(path):
    # the SARIF log must be UTF-8; the JSON document keeps a name's bytes
    with open(path, "rb") as f:
        raw = f.read()
    return raw, json.loads(raw.decode("utf-8", "surrogateescape"))


raw, log = load(sarif_path)
_, doc = load(json_path)
try:
    raw.decode("utf-8")
    check("the log is UTF-8", True)
except UnicodeDecodeError as e:
    check("the log is UTF-8 (%s)" % e, False)

try:
    import jsonschema
except ImportError:
    jsonschema = None
if jsonschema is None:
    print("SKIP: no jsonschema for this python3 (./bootstrap --deps installs "
          "python3-jsonschema): the log is not validated against the schema")
else:
    with open(os.path.join(srcdir, "tests/schemas/sarif-schema-2.1.0.json")) as f:
        schema = json.load(f)
    cls = jsonschema.validators.validator_for(schema)
    errors = sorted(cls(schema).iter_errors(log), key=lambda e: list(e.absolute_path))
    for e in errors[:10]:
        print("   schema: %s: %s" % ("/".join(map(str, e.absolute_path)), e.message[:300]))
    from importlib import metadata
    check("the log validates against the SARIF 2.1.0 schema (%s, jsonschema %s)"
          % (cls.__name__, metadata.version("jsonschema")), not errors)

check("version 2.1.0, one run", log.get("version") == "2.1.0" and len(log["runs"]) == 1)
run = log["runs"][0]
rules = run["tool"]["driver"]["rules"]
check("tool ckpt, one rule per kind of finding",
      run["tool"]["driver"]["name"] == "ckpt" and
      sorted(r["id"] for r in rules) == sorted(["dangerous-global", "unknown-global",
                                                "torchscript-code", "ambiguous-content",
                                                "outside-folder"]))
results = run["results"]
for r in results:
    if rules[r["ruleIndex"]]["id"] != r["ruleId"]:
        check("result's ruleIndex names its rule: %r" % r, False)
        break


def uri_path(r):
    uri = r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    return urllib.parse.unquote(uri, errors="surrogateescape")


# what the JSON lists, and what the log says of it
want, got = [], []
for f in doc["files"]:
    path = f["file"]
    for g in f["globals"]:
        if g["class"] == "unknown":
            want.append(("dangerous-global" if g["dangerous"] else "unknown-global", path,
                         g["global"], g["pickle"], g["offset"]))
    for c in f.get("code", []):
        want.append(("torchscript-code", path, c))
    for a in f["ambiguities"]:
        want.append(("ambiguous-content", path, a))
    if "reason" in f and f["exit"] == 1:
        want.append(("outside-folder", path, f["reason"]))
for r in results:
    p = r.get("properties", {})
    if r["ruleId"] in ("dangerous-global", "unknown-global"):
        got.append((r["ruleId"], uri_path(r), p["global"], p["pickle"], p["offset"]))
    else:
        got.append((r["ruleId"], uri_path(r), r["message"]["text"]))
check("one result per finding of the JSON document (%d)" % len(want), sorted(want) == sorted(got))
if sorted(want) != sorted(got):
    for x in sorted(set(want) ^ set(got))[:10]:
        print("   differs: %s %r" % ("JSON only" if x in want else "SARIF only", x))
levels = {"dangerous-global": "error", "unknown-global": "error", "torchscript-code": "error",
          "outside-folder": "error", "ambiguous-content": "warning"}
check("levels: error for unsafe, warning for ambiguity",
      all(r["level"] == levels[r["ruleId"]] for r in results))
check("the record and the offset in each global's message",
      all(r["properties"]["pickle"] in r["message"]["text"] and
          "byte %d of" % r["properties"]["offset"] in r["message"]["text"]
          for r in results if "pickle" in r.get("properties", {})))

# the bytes at each region: the opcode that names the global
opcodes = {"GLOBAL": b"c", "STACK_GLOBAL": b"\x93", "INST": b"i"}
placed = 0
for r in results:
    region = r["locations"][0]["physicalLocation"].get("region")
    if not region:
        continue
    placed += 1
    p = r["properties"]
    at = region["byteOffset"]
    with open(uri_path(r), "rb") as fh:
        data = fh.read(at + 1)
    b = data[at:at + 1]
    line = data.count(b"\n", 0, at) + 1
    col = at - (data.rfind(b"\n", 0, at) + 1) + 1
    if p["file_offset"] != at or (p["opcode"] in opcodes and b != opcodes[p["opcode"]]):
        check("%s: byte %d is %s's opcode (%r)" % (uri_path(r), at, p["opcode"], b), False)
        break
    if [region.get(k) for k in ("startLine", "startColumn", "endLine", "endColumn")] != \
            [line, col, line, col + 1]:
        check("%s: byte %d is line %d, column %d: %r" % (uri_path(r), at, line, col, region),
              False)
        break
else:
    check("each of the %d byte offsets given is the naming opcode's byte in the file, "
          "at the line and column given" % placed, True)

# the files not read: notifications, and an execution that failed
inv = run["invocations"][0]
notes = inv.get("toolExecutionNotifications", [])
bad = sorted(f["file"] for f in doc["files"] if f["exit"] >= 3)
check("one notification per file not read (%d)" % len(bad),
      sorted(uri_path(n) for n in notes if n["descriptor"]["id"] in ("unreadable", "not-read"))
      == bad)
check("one notification per skipped file (%d)" % len(doc["skipped"]),
      sorted(uri_path(n) for n in notes if n["descriptor"]["id"] == "skipped")
      == sorted(s["file"] for s in doc["skipped"]))
check("executionSuccessful is %s" % (not bad), inv["executionSuccessful"] == (not bad))
check("exitCode is the JSON's exit (%d)" % doc["exit"], inv["exitCode"] == doc["exit"])
sys.exit(1 if failures else 0)
