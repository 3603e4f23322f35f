"""meta.json stores the capsule's spec as the spec's JSON, and still reads the files of before."""

from __future__ import annotations

import json
from pathlib import Path

from sandbox import meta
from sandbox.spec import CapsuleSpec, Limits

REST = {"capsule_id": "cap_1700000000000_0000abcd", "created_at": "2026-01-01T00:00:00.000000+00:00",
        "owner_uid": 1000, "owner_gid": 1000, "lowers": ["/srv/ws"], "ancestors": [], "parent": None,
        "disk_mb": None}
# A meta.json as the helper wrote it before CapsuleSpec (version 1): the spec's fields at
# the top level, limits without disk_mb.
V1 = {"version": 1, **REST, "workspace": "/srv/ws", "base": None, "clock_offset_sec": -60,
      "env_whitelist": ["CI", "PYTHONPATH"], "limits": {"memory_mb": 512}, "network": "none"}


def _capsule_dir(tmp_path: Path, content: dict[str, object]) -> Path:
    root = tmp_path / str(REST["capsule_id"])
    (root / "upper").mkdir(parents=True)
    (root / "meta.json").write_text(json.dumps(content))
    return root


def test_an_old_meta_file_is_read_into_a_spec(tmp_path: Path) -> None:
    root = _capsule_dir(tmp_path, V1)
    loaded = meta.load(str(root), str(REST["capsule_id"]))
    assert not isinstance(loaded, str), loaded
    rest, spec = loaded
    assert rest == REST
    assert spec == CapsuleSpec("/srv/ws", clock_offset_sec=-60, env_whitelist=("CI", "PYTHONPATH"),
                               limits=Limits(memory_mb=512))


def test_a_new_meta_file_holds_the_spec_json_and_reads_back(tmp_path: Path) -> None:
    root = _capsule_dir(tmp_path, V1)
    spec = CapsuleSpec("/srv/ws", given_base="/snap", limits=Limits(disk_mb=64))
    meta.save(str(root / "meta.json"), REST, spec)
    written = json.loads((root / "meta.json").read_text())
    assert written == {**REST, "version": meta.VERSION, "spec": spec.to_json()}
    assert meta.load(str(root), str(REST["capsule_id"])) == (REST, spec)


def test_a_meta_file_with_a_bad_spec_is_not_recovered(tmp_path: Path) -> None:
    root = _capsule_dir(tmp_path, {**V1, "network": "host"})
    why = meta.load(str(root), str(REST["capsule_id"]))
    assert isinstance(why, str) and "network" in why
    root = _capsule_dir(tmp_path / "2", {**REST, "version": meta.VERSION})
    assert isinstance(meta.load(str(root), str(REST["capsule_id"])), str)


def test_a_fork_with_donors_reads_back_and_an_old_fork_has_one_layer_per_ancestor(tmp_path: Path) -> None:
    spec = CapsuleSpec("/srv/ws")
    fork = {**REST, "lowers": ["/s/cap_b/upper", "/s/cap_a/upper", "/s/cap_p/upper", "/srv/ws"],
            "ancestors": ["cap_a", "cap_p"], "parent": "cap_a"}
    root = _capsule_dir(tmp_path, {**fork, "version": meta.VERSION, "spec": spec.to_json()})
    loaded = meta.load(str(root), str(REST["capsule_id"]))
    assert not isinstance(loaded, str), loaded
    old = meta.Capsule(str(REST["capsule_id"]), str(root), loaded[0], spec)
    assert old.layers_above_base == 2 and old.donors == [] and old.base_lowers == ["/s/cap_p/upper", "/srv/ws"]
    merged = {**fork, "donors": ["cap_b"], "layers_above_base": 3}
    meta.save(str(root / "meta.json"), merged, spec)
    loaded = meta.load(str(root), str(REST["capsule_id"]))
    assert loaded == (merged, spec)
    capsule = meta.Capsule(str(REST["capsule_id"]), str(root), loaded[0], spec)
    assert capsule.layers_above_base == 3 and capsule.donors == ["cap_b"] and capsule.base_lowers == ["/srv/ws"]
    for bad in ({"donors": "cap_b"}, {"donors": ["../x"]}, {"donors": ["cap_b", "cap_b"]}, {"donors": ["cap_a"]},
                {"layers_above_base": 4}, {"layers_above_base": 1}, {"layers_above_base": True},
                {"layers_above_base": "3"}):
        meta.save(str(root / "meta.json"), {**merged, **bad}, spec)
        why = meta.load(str(root), str(REST["capsule_id"]))
        assert isinstance(why, str) and ("donors" in why or "layers_above_base" in why), (bad, why)
    meta.save(str(root / "meta.json"), {**REST, "donors": ["cap_b"]}, spec)
    assert "donors" in str(meta.load(str(root), str(REST["capsule_id"])))  # a capsule that is no fork has none
