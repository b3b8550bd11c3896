#!/bin/sh
# bad_inputs.sh - every hostile or malformed file of tests/bad (described in
# tests/bad/README.md) is refused by `ckpt inspect`: exit status 3, exactly
# one line on stderr, "ckpt: inspect: FILE: <message>", the message saying
# what is wrong (each file's expected message is below), nothing on stdout,
# the input left as it was, and nothing in it executed (the payloads would
# create /tmp/ckpt_pwned).  `ckpt convert FILE OUT.safetensors` refuses it
# too, and leaves no OUT (nor any temporary file) behind.  The log is a
# catalogue of the messages.
# shellcheck source=tests/cli/setup.sh
. "${srcdir:-.}/tests/cli/setup.sh"

cd "$srcdir" # so that file names print as tests/bad/NAME

pwned=/tmp/ckpt_pwned # where the os.system / eval payloads would write
if [ -e "$pwned" ]; then
    echo "ERROR: $pwned exists before the test: something ran a payload already;"
    echo "remove it and run the test again"
    exit 99
fi

# refused FILE ARGS...: `ckpt inspect ARGS FILE` refuses FILE as it should:
# exit 3, nothing on stdout (with --json: one JSON document, its error),
# one line on stderr starting "ckpt: inspect:
# FILE: " (no control characters: names taken from the file are escaped),
# FILE unchanged, no $pwned.  One "ok" line, or a FAIL naming every
# problem.
refused() {
    _file=$1
    shift
    cksum <"$_file" >"$tmp/before"
    ckpt inspect "$@" "$_file"
    _p=
    [ "$status" -eq 3 ] || _p="$_p; exit $status, expected 3"
    case " $* " in
    *" --json "*) json_error_ok || _p="$_p; stdout is not one error document ($(tail -n 1 "$tmp/pyerr"))" ;;
    *) [ ! -s "$out" ] || _p="$_p; output on stdout" ;;
    esac
    _n=$(wc -l <"$err" | tr -d ' ')
    [ "$_n" -eq 1 ] || _p="$_p; $_n lines on stderr, expected 1"
    case $(head -n 1 "$err") in
    "ckpt: inspect: $_file: "?*) ;;
    *) _p="$_p; stderr does not start with 'ckpt: inspect: $_file: '" ;;
    esac
    ! grep -q '[[:cntrl:]]' "$err" || _p="$_p; control characters in the message"
    cksum <"$_file" >"$tmp/after"
    cmp -s "$tmp/before" "$tmp/after" || _p="$_p; $_file was modified"
    [ ! -e "$pwned" ] || _p="$_p; $pwned exists: a payload ran"
    if [ -z "$_p" ]; then
        ok "refused (3, one line on stderr, no stdout, input unchanged): $last_cmd"
    else
        fail "$last_cmd: ${_p#; }"
        show_output
    fi
}

# expect NAME: sets $pat, an extended regular expression (matched without
# regard to case) that the message for tests/bad/NAME must match, and $level:
# "data" for the files whose defect is in the record data, which plain
# `inspect` does not read (it may succeed; --stats must refuse), else
# "header".  Every file of tests/bad must be listed here.
expect() {
    level=header
    case $1 in
    truncated_zip.pth | truncated_local_header.pth | \
        truncated_central_directory.pth | truncated_end_record.pth)
        pat='not a readable zip archive' ;;
    truncated_pickle.pth) pat='archive/data\.pkl at byte [0-9]+: truncated pickle' ;;
    truncated_legacy.pth) pat="truncated: storage '140000000004096' needs 48 bytes" ;;
    crc_flip.pth)
        level=data
        pat="record 'archive/data/0'.*CRC-32 mismatch" ;;
    crc_one_zeroed.pth)
        level=data
        pat="record 'archive/data/0'.*CRC-32 mismatch \(stored 00000000" ;;
    os_system.pth | os_system_nested.pth) pat="refused global 'os\.system'" ;;
    posix_system.pth) pat="refused global 'posix\.system'" ;;
    builtins_eval.pth) pat="refused global 'builtins\.eval'" ;;
    memo_bad_index.pth) pat='memo index 7 read before it was stored' ;;
    binget_before_binput.pth) pat='memo index 0 read before it was stored' ;;
    memo_index_out_of_range.pth) pat='memo index 4294967296 out of range' ;;
    stack_underflow.pth | stack_underflow_reduce.pth) pat='stack underflow' ;;
    mark_bomb.pth) pat='more than [0-9]+ nested MARKs' ;;
    setitems_on_list.pth) pat='SETITEMS? on a list' ;;
    deep_nesting.pth) pat='nested more than [0-9]+ levels' ;;
    build_on_tensor_junk.pth) pat='BUILD' ;;
    storage_too_small.pth) pat="reaching element 15\) goes past the end of storage '0'" ;;
    storage_offset_past_end.pth) pat="offset 10, .*goes past the end of storage '0'" ;;
    stride_outside.pth) pat="reaching element 8\) goes past the end of storage '0'" ;;
    stride_overflow.pth) pat="(goes past the end of storage '0'|overflow)" ;;
    shape_overflow.pth | shape_overflow_int64.pth) pat='tensor size overflows 64 bits' ;;
    negative_size.pth) pat='tensor shape has a negative entry \(-1\)' ;;
    negative_stride.pth) pat='tensor stride has a negative entry \(-1\)' ;;
    v3_view_past_end.pth) pat='goes past the end of storage .0. \(3 uint16 elements\)' ;;
    v3_unknown_dtype.pth) pat="refused global 'torch.int4'" ;;
    module_cycle.pth) pat="module tree: a module inside itself \(at 'self.'\)" ;;
    module_too_deep.pth) pat="module tree nested more than 256 deep" ;;
    two_unknown_classes.pth) pat="refused global 'mymods.X' .*--allow-global mymods.X --allow-global mymods.Y admit them" ;;
    unknown_and_dangerous.pth) pat="the pickle also names operator.attrgetter, which can run code" ;;
    byteorder_junk.pth) pat="unknown byte order 'middle'" ;;
    storage_alignment_junk.pth) pat="record '.storage_alignment' does not hold a number" ;;
    q_axis_out_of_range.pth) pat='quantized tensor: axis 2 of a 2-dimensional tensor' ;;
    q_scales_disagree.pth) pat='quantized tensor: 3 scales for 2 channels along its axis' ;;
    q_not_a_qscheme.pth) pat="_rebuild_qtensor: 'torch.float32' is not a qscheme" ;;
    q_packed_short.pth) pat="quint4x2 tensor of 15 values needs 9 bytes, storage '0' has 6" ;;
    q_float_storage.pth) pat='_rebuild_qtensor over a float32 storage, not a quantized one' ;;
    sparse_coo_count.pth) pat='_rebuild_sparse_tensor: indices for 3 values, 2 values' ;;
    v3_dtype_not_global.pth) pat='_rebuild_tensor_v3: dtype argument is not a dtype' ;;
    negative_offset.pth) pat='negative tensor offset' ;;
    storage_numel_overflow.pth) pat="storage '0' size overflows" ;;
    storage_negative_numel.pth) pat="storage '0' has an invalid element count" ;;
    storage_key_newline.pth) pat='has no record' ;;
    record_size_mismatch.pth) pat="record 'archive/data/0' is 40 bytes but storage '0' .* needs 48" ;;
    local_header_zeroed.pth) pat="record 'archive/data/0' has no local header" ;;
    missing_record.pth) pat="storage '1' has no record 'archive/data/1'" ;;
    unknown_storage_type.pth) pat='torch\.FooStorage' ;;
    bad_utf8.pth | st_bad_utf8.safetensors) pat='not valid UTF-8' ;;
    huge_length.pth) pat='opcode needs 2147483648 more bytes' ;;
    huge_length8.pth) pat='opcode needs 18446744073709551615 more bytes' ;;
    legacy_bad_count.pth) pat="storage '140000000004096' has wrong byte size: expected 12 elements, got 13" ;;
    legacy_huge_storage.pth) pat="storage '140000000004096' needs 9223372036854775808 bytes" ;;
    not_a_checkpoint.pth) pat='not a PyTorch checkpoint' ;;
    empty.pth) pat='empty file' ;;
    no_prefix_dir.pth) pat='not in a subdirectory' ;;
    zip_bomb_stored.pth | zip_bomb_zip64.pth)
        pat="record 'archive/data/0' declares [0-9]+ bytes, more than the file holds \(a zip bomb" ;;
    zip_bomb_deflate.pth)
        pat="record 'archive/data/0' declares 2147483648 bytes inflated from 36: more than deflate can expand \(a zip bomb\)" ;;
    zip_bomb_pickle.pth) pat="record 'archive/data\.pkl' declares [0-9]+ bytes inflated from [0-9]+: .*zip bomb" ;;
    zip_deflate_overrun.pth)
        level=data
        pat="record 'archive/data/0' inflates past its declared 48 bytes" ;;
    overlapping_records.pth | overlapping_records_nested.pth)
        pat="archive/data/[01].*overlap|overlap.*archive/data/[01]" ;;
    duplicate_record.pth) pat="archive/data/0.*(duplicate|twice)|(duplicate|twice).*archive/data/0" ;;
    duplicate_data_pkl.pth) pat="archive/data\.pkl.*(duplicate|twice)|(duplicate|twice).*archive/data\.pkl" ;;
    st_header_past_eof.safetensors) pat='header length 1144 goes past the end of the 188-byte file' ;;
    st_huge_header.safetensors) pat='header of 100000001 bytes is over' ;;
    st_overlap.safetensors) pat="tensor 'b' \\(bytes 12-24\\) overlaps the one before it" ;;
    st_size_mismatch.safetensors) pat="tensor 'w' is 20 bytes by its offsets" ;;
    st_offsets_out_of_bounds.safetensors) pat="tensor 'b' ends at byte 36 of a 28-byte data section" ;;
    st_truncated_data.safetensors) pat="tensor 'b' ends at byte 36 of a 32-byte data section" ;;
    st_bad_json.safetensors) pat="the JSON ends where ',' or a closing bracket is expected" ;;
    st_unknown_dtype.safetensors) pat="unknown dtype 'Q4'" ;;
    st_duplicate_name.safetensors) pat="tensor 'w' appears twice" ;;
    st_f4_half_byte.safetensors) pat="F4 tensor 'w' of 5 values does not end on a byte boundary" ;;
    st_f4_size_mismatch.safetensors) pat="tensor 'w' is 4 bytes by its offsets" ;;
    st_f4_odd_last_dim.safetensors) pat="F4 tensor 'w' has an odd last dimension \\(3\\)" ;;
    st_f6_partial_byte.safetensors) pat="F6_E2M3 tensor 'w' of 3 values does not end on a byte boundary" ;;
    st_f6_size_mismatch.safetensors) pat="tensor 'w' is 4 bytes by its offsets" ;;
    st_float_shape.safetensors) pat="tensor 'w': shape holds 2\\.0, not an unsigned integer" ;;
    st_exponent_offset.safetensors) pat="tensor 'b': data_offsets holds 36e0, not an unsigned integer" ;;
    st_negative_zero.safetensors) pat="tensor 'w': data_offsets holds -0, not an unsigned integer" ;;
    st_hole.safetensors) pat="bytes 24-28 of the data section belong to no tensor" ;;
    st_trailing_bytes.safetensors) pat="4 bytes after the last tensor's data" ;;
    st_empty_tensor_inside.safetensors) pat="tensor 'e' \\(bytes 4-4\\) overlaps the one before it" ;;
    st_lone_surrogate.safetensors) pat='a lone high surrogate escape' ;;
    st_control_char.safetensors) pat='a raw control character in a string' ;;
    st_nul_name.safetensors) pat='a tensor name with .u0000 contains NUL' ;;
    st_metadata_not_string.safetensors) pat="__metadata__ value 'epoch' is not a string" ;;
    st_two_metadata.safetensors) pat='two __metadata__ entries' ;;
    st_duplicate_field.safetensors) pat="tensor 'w' has field 'dtype' twice" ;;
    st_deep_nesting.safetensors) pat='JSON nested more than 127 levels deep' ;;
    st_huge_dimension.safetensors) pat="tensor 'b': shape holds 18446744073709551616, over 2\\^64-1" ;;
    st_trailing_garbage.safetensors) pat="bytes after the header's JSON object other than spaces" ;;
    sharded_missing_shard.index.json) pat="shard 'model-00001-of-00002\.safetensors'.*No such file" ;;
    sharded_escape.index.json) pat='maps to \.\./data/mlp\.pth, not a file name beside the index' ;;
    sharded_absolute.index.json) pat='maps to /etc/passwd, not a file name beside the index' ;;
    sharded_bad_shard.index.json) pat="shard 'st_overlap\.safetensors': .*overlap" ;;
    sharded_nul_shard.index.json) pat='shard index: a name holds a NUL character' ;;
    ts_unterminated_list.pt) pat="code file 'archive/code/__torch__/m\.py' line 2: unterminated __parameters__ list" ;;
    ts_huge_line.pt) pat="code file 'archive/code/__torch__/m\.py' line 1: a class header without a valid class name" ;;
    ts_no_lists.pt) pat='module class __torch__\.m\.Net has no __parameters__ list' ;;
    ts_missing_class.pt) pat='builds an object of __torch__\.m\.Other .*which no code/ file defines' ;;
    tar_bad_checksum.pth) pat='not a PyTorch checkpoint \(not a zip archive, a tar,' ;;
    tar_size_past_end.pth) pat='tar header 5: unexpected end of data: a member reaches past the end of the file \(torch then reads the file as a pickle stream\)' ;;
    tar_missing_member.pth) pat="tar checkpoint without a 'tensors' member" ;;
    tar_count_lies.pth) pat='tar:storages pickle 2 is not a sequence of 3 items' ;;
    tar_ndim_huge.pth) pat='tensor 94000000000704 has 2147483647 dimensions' ;;
    tar_negative_size.pth) pat='tensor 94000000000704 has a negative or overflowing size' ;;
    tar_storage_id_unknown.pth) pat='storage id 94000000000065 names no storage' ;;
    tar_storage_id_tensor.pth) pat='storage id 94000000000704 names a tensor' ;;
    tar_element_count_lies.pth) pat="storage 94000000000064: 1000 elements do not fit in the member's 46 bytes left" ;;
    tar_view_outside.pth) pat="storage view 1: elements \[8, \+5\) outside its root's 10" ;;
    tar_stride_outside.pth) pat='tensor 94000000000704 reaches past its storage of 10 elements' ;;
    tar_pid_unknown.pth) pat='tar:pickle at byte [0-9]+: persistent id 94000000000769 names no storage or tensor' ;;
    tar_storage_type_os_system.pth) pat="tar:storages pickle 1 at byte [0-9]+: refused global 'os\.system'" ;;
    tar_member_symlink.pth) pat="tar member 'pickle' is not a file \(type '2'\)" ;;
    tar_pax_size_lies.pth) pat='tar header 5: unexpected end of data' ;;
    tar_pax_record_lies.pth) pat="tar checkpoint without a 'storages' member" ;;
    tar_longname_truncated.pth) pat='tar header 2: the header after a GNU long name: empty header' ;;
    *) return 1 ;;
    esac
}

# says PATTERN: the message of the last run matches PATTERN (ERE, any case).
says() {
    if grep -Eiq -- "$1" "$err"; then
        ok "the message says /$1/"
    else
        fail "the message does not match /$1/: $last_cmd"
        show_output
    fi
}

# convert_refuses FILE: `ckpt convert FILE OUT.safetensors` exits 3 with one
# line "ckpt: convert: FILE: ..." and nothing on stdout, writes nothing, and
# leaves FILE as it was.
convert_refuses() {
    rm -rf "$tmp/conv"
    mkdir "$tmp/conv"
    cksum <"$1" >"$tmp/before"
    ckpt convert "$1" "$tmp/conv/out.safetensors"
    _p=
    [ "$status" -eq 3 ] || _p="$_p; exit $status, expected 3"
    [ ! -s "$out" ] || _p="$_p; output on stdout"
    _n=$(wc -l <"$err" | tr -d ' ')
    [ "$_n" -eq 1 ] || _p="$_p; $_n lines on stderr, expected 1"
    case $(head -n 1 "$err") in
    "ckpt: convert: $1: "?*) ;;
    *) _p="$_p; stderr does not start with 'ckpt: convert: $1: '" ;;
    esac
    ! grep -q '[[:cntrl:]]' "$err" || _p="$_p; control characters in the message"
    _left=$(listing "$tmp/conv" | tr '\n' ' ')
    [ -z "$_left" ] || _p="$_p; left behind: $_left"
    cksum <"$1" >"$tmp/after"
    cmp -s "$tmp/before" "$tmp/after" || _p="$_p; $1 was modified"
    [ ! -e "$pwned" ] || _p="$_p; $pwned exists: a payload ran"
    if [ -z "$_p" ]; then
        ok "refused, nothing written: $last_cmd"
    else
        fail "$last_cmd: ${_p#; }"
        show_output
    fi
}

n=0
for path in tests/bad/*; do
    case $path in
    *.md | *.py) continue ;;
    esac
    [ -f "$path" ] || continue
    n=$((n + 1))
    name=${path#tests/bad/}
    if ! expect "$name"; then
        fail "$name: no expected message for it in tests/cli/bad_inputs.sh (add one)"
        continue
    fi
    case $level in
    data)
        # Plain inspect reads no tensor data and may succeed; --stats reads
        # it and must find the defect.
        say "$name (with --stats: the defect is in the data)"
        refused "$path" --stats
        note "message: $(cat "$err")"
        says "$pat"
        refused "$path" --stats --json
        refused "$path" --stats --quiet
        ckpt inspect "$path"
        case $status in
        0) ok "plain inspect (no data read): exit 0" ;;
        3) refused "$path" ;;
        *)
            fail "exit $status, expected 0 or 3: $last_cmd"
            show_output
            ;;
        esac
        ;;
    *)
        say "$name"
        refused "$path"
        note "message: $(cat "$err")"
        says "$pat"
        refused "$path" --json
        refused "$path" --stats
        refused "$path" --quiet
        ;;
    esac
    convert_refuses "$path"
done
check "found $n hostile inputs in tests/bad" test "$n" -ge 60

# ---------------------------------------------------------------------------
say "crc_flip.pth without --stats: only the pickle is read, the listing succeeds"
expect_exit 0 ckpt inspect tests/bad/crc_flip.pth
expect_stderr_empty

say "crc_flip.pth: --stats --filter still checks every record, listed or not"
# The flipped bit is in archive/data/0 (tensor w); the filter lists only b.
refused tests/bad/crc_flip.pth --stats --filter '^b$'
refused tests/bad/crc_flip.pth --stats --json --filter '^b$'

# ---------------------------------------------------------------------------
say "a refusal names the global"
for f in os_system:os.system posix_system:posix.system builtins_eval:builtins.eval \
    os_system_nested:os.system unknown_storage_type:torch.FooStorage; do
    refused tests/bad/${f%%:*}.pth
    check "the message names ${f#*:}" grep -Fq "${f#*:}" "$err"
done

say "globals that run commands or code are never admitted, whatever the options"
for f in os_system:os.system posix_system:posix.system builtins_eval:builtins.eval \
    os_system_nested:os.system; do
    refused tests/bad/${f%%:*}.pth --allow-unknown
    refused tests/bad/${f%%:*}.pth --allow-global "${f#*:}"
    refused tests/bad/${f%%:*}.pth --allow-global "${f#*:}" --allow-unknown
done
note "$(cat "$err")"

say "an unknown (harmless) global: refused, unless admitted by name or by --allow-unknown"
if have_python; then
    # A zip checkpoint {"cfg": mypkg.Config()}: GLOBAL 'mypkg Config', REDUCE.
    python3 - "$tmp/cfg.pth" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w") as z:
    z.writestr("archive/data.pkl", b"\x80\x02}X\x03\x00\x00\x00cfgcmypkg\nConfig\n)Rs.")
    z.writestr("archive/version", "3\n")
EOF
    cp "$tmp/cfg.pth" "$tmp/cfg.orig"
    expect_exit 3 ckpt inspect "$tmp/cfg.pth"
    expect_stderr_prefix "ckpt: inspect: $tmp/cfg.pth: "
    check "the message names mypkg.Config and --allow-global" \
        grep -Fq -- "--allow-global mypkg.Config" "$err"
    note "$(cat "$err")"
    expect_exit 3 ckpt inspect --allow-global mypkg.Other "$tmp/cfg.pth"
    for opt in "--allow-global mypkg.Config" --allow-unknown; do
        # shellcheck disable=SC2086 # $opt is one or two words
        expect_exit 0 ckpt inspect $opt "$tmp/cfg.pth"
        expect_stderr_empty
        expect_stdout_line "objects kept opaque:"
        expect_stdout_match '^  cfg +mypkg\.Config$'
        # shellcheck disable=SC2086
        expect_exit 0 ckpt inspect --json $opt "$tmp/cfg.pth"
        json_expect 'd["objects"]' '[{"path": ["cfg"], "global": "mypkg.Config"}]'
    done
    check "the file is unchanged" cmp -s "$tmp/cfg.pth" "$tmp/cfg.orig"
else
    note "SKIP: no python3 to build the file"
fi

finish
