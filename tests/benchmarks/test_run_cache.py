"""benchmarks/studies/run_cache.py: a study's runs in one JSON-lines file; the folder of one JSON a run migrated into it,
nothing lost, and still read while it exists."""

import json
import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks" / "studies"))
from run_cache import RunCache  # noqa: E402


def test_an_entry_put_is_one_line_read_back_and_a_later_line_of_the_same_key_wins(tmp_path):
    cache = RunCache(tmp_path / "run_cache")
    assert cache.path == tmp_path / "run_cache.jsonl" and cache.get("a-1") is None and not cache.has("a-1")
    cache.put("a-1", {"name": "a", "seconds": 1.0})
    cache.put("b-2", {"name": "b", "seconds": 2.0})
    cache.put("a-1", {"name": "a", "seconds": 3.0})  # trained again (a stale entry)
    lines = cache.path.read_text().splitlines()
    assert [json.loads(x)["file"] for x in lines] == ["a-1", "b-2", "a-1"]
    assert cache.get("a-1") == {"name": "a", "seconds": 3.0} and cache.keys() == ["a-1", "b-2"] and cache.keys("b") == ["b-2"]
    other = RunCache(tmp_path / "run_cache")  # another process: reads the same file
    assert other.get("a-1") == {"name": "a", "seconds": 3.0}
    other.put("c-3", {"name": "c"})
    assert cache.get("c-3") == {"name": "c"}  # the file changed: read again
    with open(cache.path, "a") as fh:
        fh.write('{"file": "d-4", "name"')  # a line cut short by a killed process
    assert RunCache(tmp_path / "run_cache").keys() == ["a-1", "b-2", "c-3"]


def test_the_folder_layout_is_read_first_and_migrated_into_the_lines_without_losing_a_run(tmp_path):
    folder = tmp_path / "run_cache"
    folder.mkdir()
    entries = {f"run_{i}-{i:016x}": {"name": f"run/{i}", "history": [{"round": 2, "acc": i / 10}], "seconds": float(i)}
               for i in range(5)}
    for key, entry in entries.items():
        (folder / f"{key}.json").write_text(json.dumps(entry))
    (folder / "broken-0.json").write_text("{not json")
    cache = RunCache(folder)
    assert cache.get("run_3-0000000000000003") == entries["run_3-0000000000000003"] and cache.has("run_0-0000000000000000")
    assert cache.migrate() == 5
    assert sorted(p.name for p in folder.iterdir()) == ["broken-0.json"]  # what does not parse stays where it is
    fresh = RunCache(folder)
    assert {k: fresh.get(k) for k in fresh.keys("run_")} == entries
    (folder / "broken-0.json").unlink()
    assert RunCache(folder).migrate() == 0 and not folder.exists()  # the emptied folder is removed
    # an old-layout file written after the migration (an old checkout, a test) is read, and shadows the line
    folder.mkdir()
    (folder / "run_1-0000000000000001.json").write_text(json.dumps({"name": "run/1", "seconds": 99.0}))
    assert fresh.get("run_1-0000000000000001") == {"name": "run/1", "seconds": 99.0}
    fresh.put("run_1-0000000000000001", {"name": "run/1", "seconds": 100.0})  # putting the key removes that file
    assert not (folder / "run_1-0000000000000001.json").exists() and fresh.get("run_1-0000000000000001")["seconds"] == 100.0


def test_a_runner_migrates_its_cache_folder_when_it_opens_it_and_reads_the_runs_from_the_lines(tmp_path):
    import paper_results

    messages = []
    runner = paper_results.Runner(REPO, tmp_path / "w", messages.append, cache=tmp_path / "cache")
    configs, overrides = [REPO / "configs" / "quickstart.yaml"], ["--trainer.max_steps=2"]
    args = runner._args(configs, overrides)
    cached = runner._cache_file("r", args)
    cached.parent.mkdir(parents=True)
    entry = {"name": "r", "history": [{"round": 2, "acc": 0.5, "val_acc": None, "client_acc": None, "uploads": 4}],
             "summary": {"final/test_acc_last10pct": 0.5}, "seconds": 1.0, "args": [], "attention": None, "extra": {},
             "inputs": paper_results.inputs_fingerprint(args)}
    cached.write_text(json.dumps(entry))
    again = paper_results.Runner(REPO, tmp_path / "w", messages.append, cache=tmp_path / "cache")
    assert messages == ["run cache: 1 runs moved from " + str(tmp_path / "cache") + "/ into cache.jsonl"]
    assert not cached.exists() and (tmp_path / "cache.jsonl").is_file()
    assert again.is_cached("r", configs, overrides) and again.run("r", configs, overrides).last10 == 0.5  # read, not trained
    assert again.trained == 0
