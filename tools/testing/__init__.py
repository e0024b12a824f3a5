"""What only the tests use: tiny random models of every family (tiny_models.py), float comparisons in units in
the last place (ulps.py), a loader that fails on cue (failing_loader.py), a reused worker process
(reused_process.py), and the config.json rules vLLM's loader imposes (serving_config.py). What users run, and
the libraries it needs, is tools/."""
