"""The protocol's run cache (benchmarks/studies/paper_results.Runner) tells a stale entry from a current one: it records
the sha256 of the run's configs' parsed settings and of its base checkpoint's bytes, and an entry whose inputs changed
since trains again; a comment edited in a config does not make its runs stale (issue 62), and an entry that recorded a
config's bytes (before settings were fingerprinted) is read when a committed version with those bytes has today's
settings."""

import hashlib
import json
import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks" / "studies"))
import paper_results  # noqa: E402


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def settings(path) -> str:
    """A config's fingerprint: the sha256 of the canonical JSON of its parsed YAML."""
    import yaml

    canonical = json.dumps(yaml.safe_load(path.read_text()), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "settings-sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def test_the_fingerprint_holds_each_config_and_every_file_a_config_or_override_names(tmp_path):
    first, second = tmp_path / "first.pt", tmp_path / "second.pt"
    first.write_bytes(b"a base")
    second.write_bytes(b"another base")
    a = tmp_path / "a.yaml"
    a.write_text(f"model:\n  net:\n    init_args:\n      base_checkpoint: {first}   # the pretrained base\n"
                 f"      target: [net.0, {'x' * 5000}]\n")  # strings that are no file: left out (one no path can be)
    b = tmp_path / "b.yaml"
    b.write_text("model:\n  training: {client_lr: 0.1}\n  net: {class_path: lfed.models.zoo.MLP}\n")
    args = ["--config", str(a), "--config", str(b), "--model.training.client_lr=0.3", f"--trainer.default_root_dir={tmp_path}"]
    assert paper_results.inputs_fingerprint(args) == {str(a): settings(a), str(b): settings(b), str(first): sha(first)}
    override = [*args, f"--model.net.init_args.base_checkpoint={second}"]  # a file an override names counts too
    assert paper_results.inputs_fingerprint(override) == {str(a): settings(a), str(b): settings(b),
                                                          str(first): sha(first), str(second): sha(second)}
    # what determines the run: a comment, the layout and the order of keys do not change a config's fingerprint
    before = paper_results.inputs_fingerprint(args)
    b.write_text("# the model\nmodel:\n  net:\n    class_path: lfed.models.zoo.MLP   # the net\n  training:\n"
                 "    client_lr: 0.1\n")
    assert paper_results.inputs_fingerprint(args) == before
    b.write_text("model:\n  training: {client_lr: 0.2}\n  net: {class_path: lfed.models.zoo.MLP}\n")  # a value: it does
    assert paper_results.inputs_fingerprint(args)[str(b)] != before[str(b)]
    gone = ["--config", str(tmp_path / "gone.yaml")]  # a config that is not there
    assert paper_results.inputs_fingerprint(gone) == {str(tmp_path / "gone.yaml"): "missing"}
    repo = ["--config", str(REPO / "configs" / "quickstart.yaml")]  # a config in the repository: keyed relative to it
    assert list(paper_results.inputs_fingerprint(repo)) == ["configs/quickstart.yaml"]


def test_a_cached_run_whose_config_or_base_changed_is_stale(tmp_path):
    base = tmp_path / "base.pt"
    base.write_bytes(b"the base")
    config = tmp_path / "c.yaml"
    config.write_text(f"model:\n  net:\n    init_args:\n      base_checkpoint: {base}\n")
    runner = paper_results.Runner(REPO, tmp_path / "w", lambda s: None, cache=tmp_path / "cache")
    configs, overrides = [config], ["--trainer.max_steps=2"]
    args = runner._args(configs, overrides)
    cached = runner._cache_file("r", args)
    cached.parent.mkdir(parents=True)
    entry = {"name": "r", "history": [{"round": 2, "acc": 0.5, "val_acc": None, "client_acc": None, "uploads": 4}],
             "summary": {"final/test_acc_last10pct": 0.5}, "seconds": 1.0, "args": [], "attention": None, "extra": {}}
    cached.write_text(json.dumps({**entry, "inputs": paper_results.inputs_fingerprint(args)}))
    assert runner.is_cached("r", configs, overrides)
    assert runner.run("r", configs, overrides).last10 == 0.5  # read, not trained
    base.write_bytes(b"a base trained again")  # same path, other weights
    assert not runner.is_cached("r", configs, overrides)
    base.unlink()  # gone
    assert not runner.is_cached("r", configs, overrides)
    base.write_bytes(b"the base")
    assert runner.is_cached("r", configs, overrides)
    config.write_text("# a comment edited\n" + config.read_text())  # the settings are the same: still current
    assert runner.is_cached("r", configs, overrides)
    config.write_text(config.read_text() + "  client_lr: 0.2\n")  # the config edited
    assert not runner.is_cached("r", configs, overrides)
    cached.write_text(json.dumps(entry))  # written before fingerprints were recorded: read as before
    assert runner.is_cached("r", configs, overrides)
    assert not paper_results.Runner(REPO, tmp_path / "w", lambda s: None, cache=tmp_path / "cache",
                                    fresh=True).is_cached("r", configs, overrides)


def test_a_run_cached_by_a_checkout_elsewhere_is_read_here(tmp_path, monkeypatch):
    """The cache key holds the configs' paths relative to the repository, so a git worktree reads the runs the main
    checkout trained; an entry written under the older key (absolute paths: /work/main/configs/...) is found too,
    by the name and arguments it recorded, and by this checkout also under its own older key."""
    runner = paper_results.Runner(REPO, tmp_path / "w", lambda s: None, cache=tmp_path / "cache")
    configs, overrides = [REPO / "configs" / "quickstart.yaml"], ["--trainer.max_steps=2", "--model.training.client_lr=0.1"]
    args = runner._args(configs, overrides)
    here = runner._cache_file("study/r/seed0", args)
    elsewhere = tmp_path / "elsewhere" / "lfed"
    monkeypatch.setattr(paper_results, "REPO", elsewhere)  # the same run, from a checkout at another path
    there = runner._cache_file("study/r/seed0", runner._args([elsewhere / "configs" / "quickstart.yaml"], overrides))
    monkeypatch.undo()
    assert here == there
    entry = {"name": "study/r/seed0", "history": [{"round": 2, "acc": 0.5, "val_acc": 0.5, "client_acc": None,
                                                     "uploads": 4}],
             "summary": {"final/test_acc_last10pct": 0.5}, "seconds": 1.0, "args": paper_results._relative(args),
             "attention": None, "extra": {}}
    old_key = json.dumps(["study/r/seed0", [a.replace(str(REPO), str(elsewhere)) for a in args
                                            if not a.startswith("--trainer.default_root_dir=")]])
    old = here.parent / f"study_r_seed0-{hashlib.sha1(old_key.encode()).hexdigest()[:16]}.json"
    old.parent.mkdir(parents=True)
    old.write_text(json.dumps({**entry, "inputs": paper_results.inputs_fingerprint(args)}))
    assert runner.is_cached("study/r/seed0", configs, overrides)
    assert runner.run("study/r/seed0", configs, overrides).last10 == 0.5  # read, not trained
    assert not runner.is_cached("study/r/seed0", configs, ["--trainer.max_steps=2", "--model.training.client_lr=0.3"])
    old.unlink()
    ours = runner._cache_file("study/r/seed0", args, relative=False)  # this checkout's own older key
    assert ours != here
    ours.write_text(json.dumps({**entry, "args": []}))
    assert runner.is_cached("study/r/seed0", configs, overrides)


def test_an_entry_that_recorded_a_configs_bytes_is_read_when_a_committed_version_with_those_bytes_has_todays_settings(
        tmp_path, monkeypatch):
    """Before configs were fingerprinted by their settings, an entry recorded the sha256 of the config's bytes; after a
    comment edit no file has those bytes (RESULTS.md's 2,376 robustness runs, issue 62). git's history still has them:
    the entry is current when the committed version with its recorded bytes has today's settings, stale when the
    settings differ or no committed version has those bytes."""
    import subprocess

    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*a):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=repo, check=True, capture_output=True)

    config = repo / "c.yaml"
    config.write_text("# 2,160 runs\nmodel:\n  training: {client_lr: 0.1}\n")
    git("init", "-q")
    git("add", "c.yaml")
    git("commit", "-q", "-m", "v1")
    recorded = {"c.yaml": sha(config)}  # what an entry written then holds
    monkeypatch.setattr(paper_results, "REPO", repo)
    monkeypatch.setattr(paper_results, "_COMMITTED", {})
    runner = paper_results.Runner(repo, tmp_path / "w", lambda s: None, cache=tmp_path / "cache")
    configs, overrides = [config], ["--trainer.max_steps=2"]
    args = runner._args(configs, overrides)
    cached = runner._cache_file("r", args)
    cached.parent.mkdir(parents=True)
    entry = {"name": "r", "history": [{"round": 2, "acc": 0.5, "val_acc": None, "client_acc": None, "uploads": 4}],
             "summary": {"final/test_acc_last10pct": 0.5}, "seconds": 1.0, "args": [], "attention": None, "extra": {},
             "inputs": recorded}
    cached.write_text(json.dumps(entry))
    assert runner.is_cached("r", configs, overrides)  # the bytes are today's
    config.write_text("# 2,376 runs\nmodel:\n  training: {client_lr: 0.1}\n")  # a comment edited (and committed)
    git("commit", "-q", "-am", "v2")
    assert paper_results.inputs_fingerprint(args)["c.yaml"] != recorded["c.yaml"]
    assert runner.is_cached("r", configs, overrides)
    assert runner.run("r", configs, overrides).last10 == 0.5  # read, not trained
    config.write_text("model:\n  training: {client_lr: 0.3}\n")  # the settings changed: stale
    assert not runner.is_cached("r", configs, overrides)
    config.write_text("# 2,376 runs\nmodel:\n  training: {client_lr: 0.1}\n")
    cached.write_text(json.dumps({**entry, "inputs": {"c.yaml": hashlib.sha256(b"never committed").hexdigest()}}))
    assert not runner.is_cached("r", configs, overrides)  # bytes no committed version has: cannot be read back
