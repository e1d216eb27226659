"""A PyTorch model in a loop, steered by the files CTL.pause, CTL.resume and CTL.quit as vecadd_loop is;
every iteration's output compared with the first one's.  argv: CTL RATE

Run by scripts/gpu_check."""
import os, sys, time, torch
ctl, rate = sys.argv[1], float(sys.argv[2])
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512)).cuda()
x = torch.randn(64, 512, device="cuda")
with torch.no_grad():
    ref = m(x).cpu()
print(f"torch_loop ready pid={os.getpid()}", flush=True)
iters, paused = 0, False
while not os.path.exists(ctl + ".quit"):
    if os.path.exists(ctl + ".pause") and not os.path.exists(ctl + ".resume"):
        if not paused:
            print(f"paused launches={iters}", flush=True)
            paused = True
        time.sleep(1 / rate)
        continue
    if paused:
        print("resumed", flush=True)
        paused = False
    with torch.no_grad():
        y = m(x).cpu()
    if not torch.allclose(y, ref, rtol=1e-5, atol=1e-6):
        print(f"torch_loop: wrong result after {iters} iterations", flush=True)
        sys.exit(1)
    iters += 1
    time.sleep(1 / rate)
print(f"done launches={iters} ok", flush=True)
