"""The @triton.jit templates, one file per op family, importing nothing else of the package.

Each family's tile functions compute program `pid` of one op's grid:

    def <family>_tile(pid,
                      # --- pointers, shapes and strides (runtime)
                      ...,
                      # --- meta (UPPER_CASE constexprs)
                      ...)

A generated dispatcher kernel (compiler/codegen.py) calls them; compiler/<family>.py binds an op's
buffers to their parameters.
"""
