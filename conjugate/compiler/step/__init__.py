"""The step form (plan `draft.form: "step"`): the draft's k decode steps as one launch.

    table.py     the task table: every op's tiles and K slices, counters, per-program order; checked
    simulate.py  the table run with torch ops (the CPU's step launch, and the tests' oracle)
    layout.py    the table as int32 records and the weights in the loader's tile order
    launch.py    the Gluon kernel's buffers and launch on a Hopper GPU (kernels/step/)
    compiled.py  CompiledStep: a round's Step launch over the draft's buffers
"""
