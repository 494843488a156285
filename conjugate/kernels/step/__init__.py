"""The step kernel: the draft's k decode steps as one persistent, warp-specialized Gluon launch on
Hopper (device.py, ring.py), reading task records laid out by columns.py. Its host side (the task
table, the weights' layout, the launch, the CPU simulation) is conjugate/compiler/step/."""
