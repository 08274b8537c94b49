"""A model folder written whole, its files bound into one set by their sha256.

save_policy_atomically writes a folder beside its place and renames it there; manifest.json (every
file's sha256) is written before the file that completes a folder, and verify_manifest makes a file
changed, missing, added or copied in from another save one RunError naming it.
"""
import errno
import hashlib
import json
import os
import re
import shutil

from harness.files import (RunError, as_disk_full, open_data, process_alive, refuse_link, what_is,
                           write_failed)


def save_policy_atomically(model, tokenizer, folder, info=None, *, cache=False):
    """save_pretrained into a temporary folder of this process, then rename: a kill or a full disk never leaves a
    half-written folder (a failure to write is a RunError). `folder` must not exist (else a RunError, nothing
    written), except for the tiny model's caches (cache=True: a warm start, with its `info`): when another run has
    meanwhile saved a complete copy there (two runs of a seed sweep computing the same warm start), its copy is
    kept and ours dropped, and a cache folder left incomplete is replaced. Nothing else is deleted or written into."""
    tmp = f"{folder}.tmp-{os.getpid()}"
    if not cache and os.path.lexists(folder):
        raise RunError(f"{folder} already exists; name a folder that does not exist yet (nothing was written)")
    refuse_link(folder, elsewhere="")  # merge_lora's OUT, or a warm-start cache
    if what_is(tmp) not in (None, "a directory"):  # a FIFO there would hang rmtree, which opens it
        raise RunError(f"{tmp} is {what_is(tmp)}, where this program writes a folder of its own; move it away")
    shutil.rmtree(tmp, ignore_errors=True)  # a folder of an earlier process of this PID
    remove_dead_copies(folder)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(tmp)), exist_ok=True)
        os.mkdir(tmp)  # ours alone: a link or folder that appears at tmp meanwhile fails it (FileExistsError)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if info is not None:  # written last, after MANIFEST, which lists it too (tiny.load_warm_start checks them)
            info_json = json.dumps(info).encode()
            write_manifest(tmp, {"warm_start.json": hashlib.sha256(info_json).hexdigest()})
            with open(os.path.join(tmp, "warm_start.json"), "wb") as f:
                f.write(info_json)
        for attempt in range(2):
            try:
                os.rename(tmp, folder)  # fails when folder exists and is not empty: never replaces another's copy
                return
            except OSError as error:
                if error.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR) or attempt:
                    raise
            if not cache or not os.path.isdir(folder) or os.path.islink(folder):  # appeared meanwhile: not ours
                raise RunError(f"{folder} appeared while the model was being written; nothing was written there")
            if os.path.isfile(os.path.join(folder, "warm_start.json" if info is not None else "config.json")):
                return  # complete: the other run's identical result stays, ours goes (finally)
            shutil.rmtree(folder, ignore_errors=True)  # a warm-start cache folder left incomplete
    except RunError:
        raise
    except Exception as error:  # noqa: BLE001 -- OSError, safetensors' SafetensorError, ...: one line
        raise RunError(write_failed(folder, as_disk_full(error, os.path.dirname(os.path.abspath(tmp))),
                                    otherwise="", elsewhere="")) from None
    finally:  # also after a signal's Stopped: no half-written copy stays
        if os.path.isdir(tmp) and not os.path.islink(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


def remove_dead_copies(folder):
    """Remove the <folder>.tmp-<PID> folders (not links) of processes that are gone: what a kill during
    save_policy_atomically left (its own `finally` never ran)."""
    parent, name = os.path.split(os.path.abspath(folder))
    for entry in os.listdir(parent) if os.path.isdir(parent) else []:
        match = re.fullmatch(re.escape(name) + r"\.tmp-(\d+)", entry)
        path = os.path.join(parent, entry)
        if match and int(match.group(1)) != os.getpid() and not process_alive(int(match.group(1))) \
                and os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)


MANIFEST = "manifest.json"  # {"sha256": {file name: sha256 hex}}: every file of a checkpoint, written before run.json


MANIFEST_LIMIT = 1 << 20  # bytes: a manifest is ~1 KB


def file_sha256(path):
    """The sha256 hex digest of the regular file at path (files.open_data), read by 1 MiB."""
    digest = hashlib.sha256()
    with open_data(path) as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder, known=None):
    """Write folder/MANIFEST: the sha256 of every file in folder (known: {name: digest} already computed, or of a
    file about to be written, run.json's). What binds a checkpoint's files into one set (verify_checkpoint)."""
    known = known or {}
    digests = folder_digests(folder, skip=(*known, MANIFEST))
    with open(os.path.join(folder, MANIFEST), "w") as f:
        json.dump({"sha256": {**digests, **known}}, f, indent=1, sort_keys=True)


def verify_manifest(folder, hint, names=None):
    """Check folder's files (names: those only) against its MANIFEST (check_digests) -> True;
    False when it has none (a save from before it). A MANIFEST that is not a small regular file
    holding a table of digests named by folder's own file names is a RunError ending with hint."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.lexists(path):
        return False
    try:
        if what_is(path) != "a file" or os.path.getsize(path) > MANIFEST_LIMIT:
            raise ValueError(f"not a regular file of at most {MANIFEST_LIMIT} bytes")
        with open(path) as f:
            listed = json.load(f)["sha256"]
        if not isinstance(listed, dict) or not all(isinstance(digest, str) for digest in listed.values()):
            raise ValueError("no table of file names to sha256 digests")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as error:
        raise RunError(f"{path} is unreadable ({type(error).__name__}: {error}); {hint}") from None
    stray = next((name for name in listed if name in ("", ".", "..") or "/" in name or "\0" in name), None)
    if stray is not None:  # /proc/self/pagemap, ../x: never opened (only the folder's own files are hashed)
        raise RunError(f"{path} lists {stray[:80]!r}, which is no file name of its folder; {hint}")
    check_digests(folder, listed, MANIFEST, hint, names)
    return True


def check_digests(folder, listed, manifest, hint, names=None):
    """A RunError naming the first file of folder (names: of those) not as `listed` ({name: sha256}
    read from the file `manifest`, left out): missing, changed, not a regular file, or unlisted."""
    for name in sorted(names or (set(os.listdir(folder)) - {manifest}) | set(listed)):
        file, kind = os.path.join(folder, name), what_is(os.path.join(folder, name))
        if name not in listed:
            raise RunError(f"{file}: a file its save did not write (not in {manifest}); move it away, or {hint}")
        if kind != "a file":
            raise RunError(f"{file}: " + ("missing" if kind is None else f"is {kind}, not the file its save wrote")
                           + f" (listed in {manifest}); {hint}")
        if file_sha256(file) != listed[name]:
            raise RunError(f"{file}: not the file its save wrote (its sha256 differs from the one in {manifest}: "
                           f"changed, or copied from elsewhere?); {hint}")


def folder_digests(folder, skip=()):
    """{name: sha256} of every file in folder but those named in skip (a save's own files, just written)."""
    return {name: file_sha256(os.path.join(folder, name)) for name in sorted(os.listdir(folder)) if name not in skip}
