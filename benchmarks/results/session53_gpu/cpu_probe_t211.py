"""Device-CPU probe (torch 2.11): does the tiny Llama's generate build under plain torch.compile, under turboquant,
and under turboquant without compat._cpp_bounds_asserts."""
import copy, os, re, shutil, sys
import torch
import turboquant
import turboquant.compat as compat
from turboquant.testing import tiny_hf_model

OUT = os.environ["OUT"]
ids = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(1))
base = tiny_hf_model("llama")
with torch.no_grad():
    ref = base.generate(ids, max_new_tokens=4, do_sample=False)


def attempt(name, make):
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            out = make().generate(ids, max_new_tokens=4, do_sample=False)
        print(f"OK   {name}: same tokens {torch.equal(out, ref)}", flush=True)
    except Exception as e:
        msg = str(e)
        errs = [l.strip() for l in msg.splitlines() if "error:" in l][:2]
        print(f"FAIL {name}: {type(e).__name__} {errs}", flush=True)
        cpp = re.findall(r"(/tmp/torchinductor_\w+/\w+/\w+\.main\.cpp)", msg)
        if cpp:
            shutil.copy(cpp[0], f"{OUT}/failing_kernel_{name.split()[0]}.cpp")


attempt("plain torch.compile", lambda: torch.compile(copy.deepcopy(base)))
attempt("turboquant-8 (asserts off)", lambda: turboquant.compile(copy.deepcopy(base), bits=8))
compat._cpp_bounds_asserts = lambda example_inputs: {}
attempt("turboquant-8-asserts-on", lambda: turboquant.compile(copy.deepcopy(base), bits=8))
