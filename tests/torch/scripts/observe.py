"""What PyTorch reports about the GPU and its memory, as JSON (a test runs
it with and without the shim in observe mode and compares)."""
import torch

from model import Model, loss_fn, result


def main():
    props = torch.cuda.get_device_properties(0)
    seen = {
        "available": torch.cuda.is_available(),
        "count": torch.cuda.device_count(),
        "name": torch.cuda.get_device_name(0),
        "capability": list(torch.cuda.get_device_capability(0)),
        "props": str(props),
        "total_memory": props.total_memory,
        "arch_list": torch.cuda.get_arch_list(),
    }
    free0, total0 = torch.cuda.mem_get_info()
    seen["mem_get_info_before"] = [free0, total0]
    model = Model().cuda()
    x = torch.randn(4, 64, 256, device="cuda")
    loss_fn(model(x)).backward()
    torch.cuda.synchronize()
    seen["mem_get_info_after"] = list(torch.cuda.mem_get_info())
    stats = torch.cuda.memory_stats()
    seen["stats"] = {k: stats[k] for k in sorted(stats) if isinstance(stats[k], int)}
    seen["max_reserved"] = torch.cuda.max_memory_reserved()
    seen["summary_lines"] = len(torch.cuda.memory_summary().splitlines())
    result("observed", **seen)


if __name__ == "__main__":
    main()
