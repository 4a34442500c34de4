"""Three real text corpora that any CPython 3.11/3.12 install ships, offline, and a byte tokenizer.

* code:  the standard library's own *.py sources, one document per file.
* prose: English documentation: pydoc_data.topics' topic texts (the language reference sections
         `help()` prints) and each stdlib module's docstrings (module, classes, functions), read
         with `ast` (no import), one document per topic / module.
* json:  JSON documents generated from real structured data the standard library ships: Unicode
         character records (unicodedata), HTTP statuses, MIME types, codec aliases, HTML entities,
         locale aliases, keywords and token names, in varied shapes (records, maps, nested groups) and
         indentations (compact, 1, 2, 4 spaces, sorted or not).

Every document has a key (its path or generator name); a document is held out (never trained on)
when a hash of its key falls in the held-out share, so the split is deterministic and the same on
every machine with the same Python. `prompts(task, n, prompt_len, seed)` cuts prompt byte strings
from held-out documents.

Tokens are bytes shifted past the engine's special ids: token = byte + FIRST_CONTENT_TOKEN_ID.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.core.request import FIRST_CONTENT_TOKEN_ID

TASKS = ("code", "prose", "json")
HELD_OUT_PERCENT = 10
# 16 special ids + 256 bytes, padded to a multiple of 32 (friendlier GEMM shapes)
VOCAB_SIZE = -(-(FIRST_CONTENT_TOKEN_ID + 256) // 32) * 32
# a source file past this size is mostly data tables (unicode, encodings): kept out of "code"
MAX_CODE_FILE_BYTES = 200_000


@dataclass(frozen=True, slots=True)
class Document:
    key: str  # where it came from: the split is decided on this
    text: bytes


def encode(data: bytes) -> np.ndarray:
    """Token ids (int64) of a byte string."""
    return np.frombuffer(data, dtype=np.uint8).astype(np.int64) + FIRST_CONTENT_TOKEN_ID


def decode(tokens) -> bytes:
    """Bytes of token ids; special ids (below the first content id) are dropped."""
    return bytes(int(t) - FIRST_CONTENT_TOKEN_ID for t in tokens
                 if FIRST_CONTENT_TOKEN_ID <= int(t) < FIRST_CONTENT_TOKEN_ID + 256)


def is_held_out(key: str) -> bool:
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:4], "little") % 100 < HELD_OUT_PERCENT


def _stdlib_sources() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__")
    return sorted(p for p in root.rglob("*.py") if not any(s in p.relative_to(root).parts for s in skip))


def code_documents() -> list[Document]:
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in _stdlib_sources():
        data = path.read_bytes()
        if 0 < len(data) <= MAX_CODE_FILE_BYTES:
            out.append(Document(f"code/{path.relative_to(root).as_posix()}", data))
    return out


def _docstrings(source: bytes) -> list[str]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    nodes = [tree] + [n for n in ast.walk(tree)
                      if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
    docs = (ast.get_docstring(n) for n in nodes)
    return [d for d in docs if d and len(d) >= 40]


def prose_documents() -> list[Document]:
    from pydoc_data.topics import topics

    out = [Document(f"prose/topic/{name}", text.encode()) for name, text in sorted(topics.items()) if text]
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in _stdlib_sources():
        docs = _docstrings(path.read_bytes())
        if docs:
            out.append(Document(f"prose/doc/{path.relative_to(root).as_posix()}", "\n\n".join(docs).encode()))
    return out


# ---------------------------------------------------------------------------- json
def _unicode_records(start: int, stop: int) -> list[dict]:
    import unicodedata as ud

    rows = []
    for cp in range(start, stop):
        ch = chr(cp)
        name = ud.name(ch, "")
        if not name or name.endswith(f"-{cp:04X}") or name.startswith("HANGUL SYLLABLE"):
            continue  # no name, or one derived from the code point (CJK, Tangut, Hangul): no information
        row = {"code_point": f"U+{cp:04X}", "name": name, "category": ud.category(ch),
               "bidirectional": ud.bidirectional(ch), "combining": ud.combining(ch),
               "east_asian_width": ud.east_asian_width(ch), "mirrored": bool(ud.mirrored(ch))}
        if ud.decomposition(ch):
            row["decomposition"] = ud.decomposition(ch)
        if ud.numeric(ch, None) is not None:
            row["numeric"] = ud.numeric(ch)
        rows.append(row)
    return rows


def _json_sources() -> dict[str, object]:
    """Named JSON-able objects built from the standard library's data."""
    import encodings.aliases
    import html.entities
    import http
    import keyword
    import locale
    import mimetypes
    import token

    mt = mimetypes.MimeTypes()
    out: dict[str, object] = {
        "http_status": [{"code": s.value, "phrase": s.phrase, "description": s.description} for s in http.HTTPStatus],
        "mime_types": dict(sorted(mt.types_map[True].items())),
        "mime_by_type": _group({ext: t for ext, t in mt.types_map[True].items()}),
        "codec_aliases": dict(sorted(encodings.aliases.aliases.items())),
        "codecs_grouped": _group(encodings.aliases.aliases),
        "keywords": {"keywords": keyword.kwlist, "soft_keywords": keyword.softkwlist},
        "tokens": {name: num for num, name in sorted(token.tok_name.items())},
    }
    ents = sorted(html.entities.html5.items())
    for i in range(0, len(ents), 250):
        out[f"html5_entities/{i}"] = [{"entity": k, "text": v, "code_points": [ord(c) for c in v]}
                                      for k, v in ents[i:i + 250]]
    loc = sorted(locale.locale_alias.items())
    for i in range(0, len(loc), 200):
        out[f"locale_alias/{i}"] = {k: {"locale": v.split(".")[0], "encoding": v.split(".")[1] if "." in v else None}
                                    for k, v in loc[i:i + 200]}
    for start in range(0, 0x30000, 0x200):
        rows = _unicode_records(start, start + 0x200)
        if rows:
            out[f"unicode/{start:05X}"] = rows
    return out


def _group(mapping: dict[str, str]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for k, v in sorted(mapping.items()):
        groups.setdefault(v, []).append(k)
    return groups


_STYLES = ({"indent": None}, {"indent": 2}, {"indent": 4}, {"indent": 1, "sort_keys": True},
           {"indent": 2, "sort_keys": True}, {"indent": None, "separators": (",", ":")})


def json_documents() -> list[Document]:
    out = []
    for key, obj in _json_sources().items():
        style = _STYLES[int(hashlib.sha256(key.encode()).digest()[4]) % len(_STYLES)]
        out.append(Document(f"json/{key}", json.dumps(obj, ensure_ascii=False, **style).encode()))
    return out


_BUILDERS = {"code": code_documents, "prose": prose_documents, "json": json_documents}


@functools.cache
def documents(task: str) -> tuple[Document, ...]:
    """All documents of a task, in a fixed order."""
    if task not in _BUILDERS:
        raise ValueError(f"unknown task {task!r}; use one of {TASKS}")
    return tuple(_BUILDERS[task]())


def split(task: str, held_out: bool) -> list[Document]:
    return [d for d in documents(task) if is_held_out(d.key) == held_out]


def token_stream(task: str, held_out: bool) -> np.ndarray:
    """One task's train (or held-out) documents as one uint8 byte array, separated by NUL bytes."""
    return np.frombuffer(b"\x00".join(d.text for d in split(task, held_out)), dtype=np.uint8)


def prompts(task: str, n: int, prompt_len: int, seed: int = 0) -> list[bytes]:
    """`n` prompts of `prompt_len` bytes cut at random offsets from held-out documents of `task`
    (documents shorter than the prompt are skipped)."""
    docs = [d for d in split(task, held_out=True) if len(d.text) >= prompt_len]
    if not docs:
        raise ValueError(f"no held-out {task} document has {prompt_len} bytes; ask for shorter prompts")
    rng = np.random.default_rng([seed, TASKS.index(task)])
    out = []
    for _ in range(n):
        d = docs[int(rng.integers(len(docs)))]
        start = int(rng.integers(len(d.text) - prompt_len + 1))
        out.append(d.text[start:start + prompt_len])
    return out


__all__ = ["TASKS", "VOCAB_SIZE", "Document", "decode", "documents", "encode", "is_held_out", "prompts", "split",
           "token_stream"]
