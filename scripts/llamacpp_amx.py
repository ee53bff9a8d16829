"""Exit 1 when the installed llama.cpp was built with ggml's AMX matmul (AMX_INT8 = 1).

That path segfaults on the first q8_0 prompt on Xeons with AMX (ggml_backend_amx_mul_mat;
llama.cpp issue #20824, open). The Makefile builds llama-cpp-python without it on x86_64 and
runs this check afterwards, rebuilding once when pip reused an older cached wheel with AMX.
"""

import sys

import llama_cpp

info = llama_cpp.llama_print_system_info().decode()
if "AMX_INT8 = 1" in info:
    print("llama.cpp was built with ggml's AMX matmul, which crashes on this CPU: rebuilding "
          "without it", file=sys.stderr)
    sys.exit(1)
