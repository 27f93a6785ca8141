"""Issue 14: an out-of-line result payload file that is gone or cut short fails the open.

Before, the open succeeded and the worker later dead-lettered the acknowledged result
(``payload_unreadable``). Now the open refuses with the path and the rule, the CLI prints
one line, and ``continuations doctor`` explains it; only sizes are compared at open.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import msgspec
import pytest
from _disk_helpers import snapshot
from fakes.harness import make_config, running
from fakes.producer import reply_run

from afterword.cli import main
from afterword.continuations.model import decode_continuation, encode
from afterword.store import Put, RecordStore
from afterword.store.evidence import EvidenceError

DETAIL = "x" * (40 * 1024)  # out of line: above the 16 KiB inline limit


async def _accepted(tmp_path: Path) -> tuple[object, dict[str, str], str, Path]:
    """A service state holding one accepted result whose payload is out of line."""
    config, env = make_config(tmp_path)
    async with running(config, env, run_worker=False) as h:
        claimed = await reply_run(h.service, h.producer, {"summary": "s", "detail": DETAIL})
        rec = h.service.repo.get(claimed.id)
        assert rec is not None and rec.result is not None and rec.result.payload_digest is not None
        path = Path(config.state_dir) / "payloads" / rec.result.payload_digest
        assert rec.result.payload_size == path.stat().st_size > 16 * 1024
        assert list((Path(config.state_dir) / "blobs").iterdir())  # an origin snapshot too
    return config, env, claimed.id, path


async def _refused(config: object, env: dict[str, str], rule: str, path: Path) -> None:
    with pytest.raises(EvidenceError) as err:
        async with running(config, env, run_worker=False):  # type: ignore[arg-type]
            pass
    assert err.value.rule == rule and err.value.path == str(path), err.value


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_deleted_payload_fails_the_open_with_one_line_and_doctor_explains(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, env, cid, path = anyio.run(_accepted, tmp_path)  # the CLI below runs its own loop
    path.unlink()
    anyio.run(_refused, config, env, "payload_missing", path)
    state = str(Path(config.state_dir))  # type: ignore[attr-defined]
    before = snapshot(state)
    code, _, err = _cli(capsys, "serve", "--config", str(tmp_path / "afterword.json"))
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and "payload_missing" in lines[0] and str(path) in lines[0], err
    code, out, _ = _cli(capsys, "continuations", "doctor", "--config", str(tmp_path / "afterword.json"))
    assert code == 2 and "payload_missing" in out and str(path) in out and cid in out, out
    code, out, _ = _cli(
        capsys, "continuations", "doctor", "--json", "--config", str(tmp_path / "afterword.json")
    )
    assert json.loads(out)["rule"] == "payload_missing"
    assert snapshot(state) == before  # nothing was repaired or swept


@pytest.mark.anyio
async def test_truncated_payload_fails_the_open(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, env, _, path = await _accepted(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    await _refused(config, env, "payload_size", path)
    code, out, _ = _cli(capsys, "continuations", "doctor", "--config", str(tmp_path / "afterword.json"))
    assert code == 2 and "payload_size" in out


@pytest.mark.anyio
async def test_record_from_before_sizes_were_kept_is_held_to_the_inline_limit(tmp_path: Path) -> None:
    config, env, cid, path = await _accepted(tmp_path)
    with RecordStore.open(config.state_dir) as store:  # type: ignore[attr-defined]
        rec = decode_continuation(store.get("c/" + cid).value)  # type: ignore[union-attr]
        assert rec.result is not None
        old = msgspec.structs.replace(rec, result=msgspec.structs.replace(rec.result, payload_size=None))
        store.transact_sync([Put("c/" + cid, encode(old), blobs=store.get("c/" + cid).blobs)])  # type: ignore[union-attr]
    async with running(config, env, run_worker=False) as h:  # type: ignore[arg-type]
        assert h.service.repo.get(cid) is not None  # an intact file opens
    path.write_bytes(path.read_bytes()[:100])
    await _refused(config, env, "payload_size", path)


@pytest.mark.anyio
async def test_missing_origin_snapshot_keeps_its_documented_fallback(tmp_path: Path) -> None:
    config, env, cid, _ = await _accepted(tmp_path)
    for blob in (Path(config.state_dir) / "blobs").iterdir():  # type: ignore[attr-defined]
        blob.unlink()
    async with running(config, env, run_worker=False) as h:  # type: ignore[arg-type]
        assert h.service.repo.get(cid) is not None
