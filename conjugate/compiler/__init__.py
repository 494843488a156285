"""Compiler: Triton op templates (one file per family), launch code generation, lowering, the packed
operand layout and CompiledRound. Entry point: conjugate.compiler.round.compile_round."""
