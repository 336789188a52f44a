"""thinwire.train.fast_start: an optimizer built, checkpointed and restored without importing
torch's compiler; torch's own mark once the compiler is loaded; the background import. Each
case runs in a fresh interpreter (this one has imported the compiler long ago)."""

import json
import subprocess
import sys
import textwrap

from thinwire.train import fast_start


def _run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_an_optimizer_is_built_saved_and_restored_without_the_compiler():
    result = _run("""
        import json, sys, torch
        from thinwire.train import fast_start
        applied = fast_start.skip_compiler_import()
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(2))], "lr": 0.5})
        model(torch.ones(4, 3)).sum().backward()
        saved = opt.state_dict()
        opt.zero_grad()
        opt.load_state_dict(saved)
        print(json.dumps({"applied": applied, "compiler": "torch._dynamo" in sys.modules,
                          "groups": [g["lr"] for g in opt.param_groups],
                          "grads": [p.grad is None for p in model.parameters()]}))
    """)
    assert result == {"applied": list(fast_start.METHODS), "compiler": False,
                      "groups": [0.1, 0.5], "grads": [True, True]}


def test_once_the_compiler_is_loaded_the_methods_carry_torchs_mark_and_compile():
    result = _run("""
        import json, sys, torch
        from thinwire.train import fast_start
        fast_start.skip_compiler_import()
        fn, _ = fast_start.wrapped_function(torch.optim.Optimizer.zero_grad)
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        before = getattr(getattr(fn, "__dynamo_disable"), "thinwire_stand_in", False)
        thread = fast_start.import_compiler_in_background()
        thread.join()
        model(torch.ones(4, 3)).sum().backward()
        opt.step()  # torch's step imports the compiler itself (a graph break)

        @torch.compile(backend="eager")
        def train_step(x):
            loss = model(x).sum()
            loss.backward()
            opt.zero_grad()  # torch's mark: not traced
            return loss

        loss = train_step(torch.ones(4, 3))
        after = getattr(fn, "__dynamo_disable")
        print(json.dumps({"before": before, "importing": fast_start.IMPORTING.is_set(),
                          "after_is_stand_in": getattr(after, "thinwire_stand_in", False),
                          "finite": bool(torch.isfinite(loss)),
                          "grads": [p.grad is None for p in model.parameters()]}))
    """)
    assert result == {"before": True, "importing": False, "after_is_stand_in": False,
                      "finite": True, "grads": [True, True]}


def test_a_method_of_another_shape_is_left_alone():
    def plain(self):
        return self

    assert fast_start.wrapped_function(plain) is None
    assert fast_start.wrapped_function(None) is None
