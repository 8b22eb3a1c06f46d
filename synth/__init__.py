"""The project's own generator of synthetic run folders (fixtures, demo, benchmark input).

Real logs cannot go into the repository, yet tests need runs whose causes are
known. So runs are written from scenario definitions, deterministically (seeded
randomness, fixed start time): regenerating gives byte-identical files, and a
test proves the committed `fixtures/` are exactly this generator's output.

- `nccl` and `pytorch`: the lines one process prints, per NCCL version.
- `runs`: a `Scenario` (hosts, layout, story) played into the files of a run folder.
- `scenarios`: the fixture catalogue; `python -m synth fixtures/` writes it.

To add a source (DeepSpeed steps, perfquery dumps, pcaps): a module that formats
its lines or bytes, story events in `runs` that emit them, and scenarios using them.
"""
