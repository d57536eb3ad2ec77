"""acc.hooks (Accelerate's accelerate.hooks): ModelHooks around forward, device alignment and offload,
cpu_offload_with_hook, and acc.big_model's dispatch hooks being the same mechanism."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import acc
from acc.big_model import cpu_offload, remove_hooks
from acc.hooks import (
    AlignDevicesHook,
    CpuOffload,
    ModelHook,
    SequentialHook,
    UserCpuOffloadHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    remove_hook_from_module,
    remove_hook_from_submodules,
)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
        self.register_buffer("scale", torch.full((3,), 2.0))

    def forward(self, x, shift=0.0):
        return self.b(self.a(x)) * self.scale + shift


@pytest.fixture
def net_and_reference():
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(5, 4)
    with torch.no_grad():
        expected = net(x)
    return net, x, expected


class AddToInput(ModelHook):
    def __init__(self, value):
        self.value, self.calls = value, []

    def pre_forward(self, module, *args, **kwargs):
        self.calls.append("pre")
        return (args[0] + self.value, *args[1:]), kwargs


class Double(ModelHook):
    def post_forward(self, module, output):
        return output * 2


def test_a_hook_sees_args_and_kwargs_and_runs_for_call_and_forward():
    lin = nn.Linear(2, 2)
    x = torch.randn(3, 2)
    with torch.no_grad():
        plain = lin(x)

    class Kw(ModelHook):
        def pre_forward(self, module, *args, **kwargs):
            seen.append(sorted(kwargs))
            return args, kwargs

    seen = []
    add_hook_to_module(lin, Kw())
    lin(input=x)
    assert seen == [["input"]] and lin._hf_hook.__class__ is Kw
    hook = AddToInput(1.0)
    add_hook_to_module(lin, hook)  # replaces the previous hook
    with torch.no_grad():
        torch.testing.assert_close(lin(x), plain + lin.weight.sum(1))
        torch.testing.assert_close(lin.forward(x), plain + lin.weight.sum(1))  # forward itself is hooked
    assert hook.calls == ["pre", "pre"] and seen == [["input"]]
    remove_hook_from_module(lin)
    assert not hasattr(lin, "_hf_hook") and not hasattr(lin, "_old_forward") and "forward" not in lin.__dict__
    with torch.no_grad():
        torch.testing.assert_close(lin(x), plain)


def test_append_chains_hooks_in_order_and_no_grad():
    lin = nn.Linear(2, 2)
    x = torch.randn(3, 2)
    add_hook_to_module(lin, AddToInput(1.0))
    add_hook_to_module(lin, Double(), append=True)
    assert isinstance(lin._hf_hook, SequentialHook) and len(lin._hf_hook.hooks) == 2
    with torch.no_grad():
        torch.testing.assert_close(lin(x), 2 * (lin._old_forward(x + 1.0)))

    class NoGrad(ModelHook):
        no_grad = True

    add_hook_to_module(lin, NoGrad())
    assert lin(x).requires_grad is False and lin._old_forward(x).requires_grad is True
    remove_hook_from_submodules(lin)
    assert lin(x).requires_grad is True


def test_align_devices_hook_offloads_weights_between_forwards(net_and_reference):
    net, x, expected = net_and_reference
    hook = AlignDevicesHook(execution_device="cpu", offload=True, io_same_device=True, place_submodules=True)
    add_hook_to_module(net, hook)
    assert all(p.is_meta for p in net.parameters()) and net.scale.device.type == "cpu"  # buffers stay
    seen = []
    net.b[0].register_forward_pre_hook(lambda m, args: seen.append(m.weight.device.type))
    with torch.no_grad():
        torch.testing.assert_close(net(x), expected)
    assert seen == ["cpu"] and all(p.is_meta for p in net.parameters())
    remove_hook_from_module(net)  # detach puts the weights back where they were
    assert not any(p.is_meta for p in net.parameters())
    with torch.no_grad():
        torch.testing.assert_close(net(x), expected)


def test_attach_align_device_hook_with_a_weights_map(net_and_reference):
    net, x, expected = net_and_reference
    weights = {k: v.clone() for k, v in net.state_dict().items()}
    attach_align_device_hook(net, execution_device="cpu", offload=True, weights_map=weights)
    assert isinstance(net.b[2]._hf_hook, AlignDevicesHook) and not hasattr(net.b[1], "_hf_hook")  # Tanh: no tensors
    assert net.b[2]._hf_hook.weights_map["weight"] is weights["b.2.weight"]  # prefixed view
    assert all(p.is_meta for p in net.parameters())
    with torch.no_grad():
        torch.testing.assert_close(net(x, shift=1.0), expected + 1.0)
    remove_hook_from_submodules(net)
    assert not any(hasattr(m, "_hf_hook") for m in net.modules())


def test_attach_align_device_hook_on_blocks_offloads_only_the_chosen_blocks(net_and_reference):
    net, x, expected = net_and_reference
    weights = {k: v.clone() for k, v in net.state_dict().items()}
    attach_align_device_hook_on_blocks(net, execution_device={"": "cpu", "a": "cpu", "b": "cpu"},
                                       offload={"": False, "a": False, "b": True}, weights_map=weights)
    assert not net.a.weight.is_meta and net.b[0].weight.is_meta
    with torch.no_grad():
        torch.testing.assert_close(net(x), expected)
    assert net.b[0].weight.is_meta


def test_a_failing_forward_releases_offloaded_weights(tmp_path, net_and_reference):
    net, x, expected = net_and_reference
    acc.disk_offload(net, tmp_path / "off", execution_device="cpu")
    with pytest.raises(RuntimeError):
        net(torch.randn(5, 7))  # wrong width: the first Linear raises inside its forward
    assert all(p.is_meta for p in net.parameters())  # released although post_forward never ran
    with torch.no_grad():
        torch.testing.assert_close(net(x), expected)


def test_remove_hook_from_module_removes_acc_dispatch_hooks(net_and_reference):
    net, x, expected = net_and_reference
    cpu_offload(net, execution_device="cpu")
    hooked = [name for name, m in net.named_modules() if hasattr(m, "_hf_hook")]
    assert {"a", "b.0", "b.2"} <= set(hooked)
    remove_hook_from_module(net, recurse=True)
    assert not any(hasattr(m, "_hf_hook") or "forward" in m.__dict__ for m in net.modules())
    # Accelerate's semantics: the weights come back, in CPU memory, and the bare model runs
    assert not any(p.is_meta for p in net.parameters()) and all(p.device.type == "cpu" for p in net.parameters())
    with torch.no_grad():
        torch.testing.assert_close(net(x), expected)


def test_dispatch_keeps_a_users_hook_and_remove_hooks_removes_only_its_own(net_and_reference):
    net, x, expected = net_and_reference
    user = AddToInput(0.0)
    add_hook_to_module(net.a, user)
    cpu_offload(net, execution_device="cpu")
    cpu_offload(net, execution_device="cpu")  # dispatched again: its hooks replaced, not stacked
    chain = net.a._hf_hook
    assert isinstance(chain, SequentialHook) and chain.hooks[0] is user and len(chain.hooks) == 2
    with torch.no_grad():
        torch.testing.assert_close(net(x), expected)
    assert user.calls == ["pre"]
    remove_hooks(net)
    assert net.a._hf_hook is user and not any(hasattr(m, "_hf_hook") for n, m in net.named_modules() if n != "a")


def test_cpu_offload_with_hook_on_the_cpu():
    first, second = nn.Linear(3, 3), nn.Linear(3, 2)
    x = torch.randn(2, 3)
    with torch.no_grad():
        expected = second(first(x))
    first, hook_1 = acc.cpu_offload_with_hook(first, execution_device="cpu")
    second, hook_2 = acc.cpu_offload_with_hook(second, "cpu", prev_module_hook=hook_1)
    assert isinstance(hook_1, UserCpuOffloadHook) and isinstance(second._hf_hook, CpuOffload)
    assert second._hf_hook.prev_module_hook is hook_1 and hook_2.model is second
    assert CpuOffload().execution_device == (torch.device("cuda", 0) if torch.cuda.is_available() else
                                             torch.device("mps") if torch.backends.mps.is_available() else
                                             torch.device("cpu"))
    with torch.no_grad():
        torch.testing.assert_close(second(first(x)), expected)
    hook_2.offload()
    hook_1.remove()
    assert not hasattr(first, "_hf_hook") and hasattr(second, "_hf_hook")


@pytest.mark.cuda
def test_cpu_offload_with_hook_moves_each_model_in_and_the_previous_out():
    first, second = nn.Linear(3, 3), nn.Linear(3, 2)
    x = torch.randn(2, 3)
    with torch.no_grad():
        expected = second(first(x))
    first, hook_1 = acc.cpu_offload_with_hook(first, "cuda:0")
    second, hook_2 = acc.cpu_offload_with_hook(second, "cuda:0", prev_module_hook=hook_1)
    assert first.weight.device.type == "cpu" and second.weight.device.type == "cpu"
    with torch.no_grad():
        hidden = first(x)  # the input comes to the model's device
        assert hidden.device.type == "cuda" and first.weight.device.type == "cuda"
        assert second.weight.device.type == "cpu"
        out = second(hidden)
    assert first.weight.device.type == "cpu" and second.weight.device.type == "cuda"  # first was offloaded
    torch.testing.assert_close(out.cpu(), expected)
    hook_2.offload()
    assert second.weight.device.type == "cpu"
