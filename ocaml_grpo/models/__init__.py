"""The models the commands train and sample: loading and merging (loading.py), the pretrained
models that come by name from a package registry (named.py), and the tiny local models the tests
and the demo build (tiny.py). Between the grader and the trainer: nothing here grades, nothing
here trains."""
