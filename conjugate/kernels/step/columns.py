"""What the step kernel and its host side agree on: tile sizes, the task record's int32 columns and
the stamps' columns.

A record is REC int32 columns (C_*); a task's first wait is inline (C_W1C, C_W1T; target 0 when it
has none), the rest sit in the wait list from C_WOFF. Weight tiles are SLOT_ROWS x K_TILE bf16, the
TMA box of one ring slot. Plain Python: the host (compiler/step/layout.py) writes records by these,
the Gluon kernel (ring.py, device.py) reads them.
"""
SLOT_ROWS, K_TILE, HALF_ROWS = 128, 64, 64  # a ring slot [rows, K]; a paired tile's half
ROW_TILES = (16, 32, 64)  # a launch's activation rows, padded to the first of these (the wgmma N)
BATCH_PAD = 32  # the draft step form's sequences (#48 asks for 1 to 32): 16 or 32 activation rows
OPS = {"embed": 0, "qkv": 1, "attn": 2, "o_proj": 3, "gate_up": 4, "down": 5, "head": 6}
(C_OP, C_STEP, C_LAYER, C_TILE, C_KLO, C_KHI, C_SPLITS, C_PARTS, C_DONE, C_WOFF, C_WCNT, C_FOFF, C_FCNT,
 C_ROW0, C_SEG, C_HEAD0, C_COL0, C_TOKEN, C_W1C, C_W1T) = range(20)
REC = 20  # int32 columns a record
# A stamped launch's int64 %globaltimer columns a task (ns): the compute partition's start, waits met,
# activations staged (attention: its chunk done; a GEMM staging its K a run at a time: waits met),
# product done (the ring's weight tiles waited for and multiplied; attention: its chunk done), end
# (epilogue and counters included); the loader's issue of the task's first weight tile (0 for tasks
# with no weights); and the parts counter's answer back (the task's pieces all arrived before it?).
S_START, S_MET, S_STAGED, S_MULTIPLIED, S_END, S_ISSUED, S_ARRIVED = range(7)
STAMP_COLS = 7
