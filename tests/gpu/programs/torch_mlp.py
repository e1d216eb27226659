"""A small PyTorch MLP on the GPU: three warm-up passes, then argv[1] timed ones; prints per_iter_s=.

Run by scripts/gpu_check."""
import sys, time, torch
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024)).cuda()
x = torch.randn(256, 1024, device="cuda")
for _ in range(3): m(x)
torch.cuda.synchronize()
t = time.perf_counter()
iters = int(sys.argv[1])
for _ in range(iters): y = m(x)
torch.cuda.synchronize()
print(f"per_iter_s={(time.perf_counter() - t) / iters:.6e}")
