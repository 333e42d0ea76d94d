"""A/B of a CNN forward (conv kernel stored HWIO by permute-conv-kernel-state)
on the native lane (HLOALIAS_NATIVE=1) and the Python path (=0, what every
such program took before branch savepre): process CPU time per call, the
paths alternating round by round in one process (bench/RESULTS-runtime.md)."""
import os, time, statistics, torch, hloalias
class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__(); torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3); self.bn = torch.nn.BatchNorm2d(8); self.head = torch.nn.Linear(8, 2)
    def forward(self, x): return self.head(torch.relu(self.bn(self.conv(x))).mean((2, 3)))
x = torch.randn(2, 3, 8, 8)
exes = {}
for path in ("native", "python"):
    os.environ["HLOALIAS_NATIVE"] = "1" if path == "native" else "0"
    m = SmallCNN().eval()
    exes[path] = hloalias.compile(m, (x,))
    print(path, "lane:", exes[path]._lane is not None, exes[path]._python_only_reason)
def rep(exe, n=1000):
    for _ in range(200): exe(x)
    t = time.process_time()
    for _ in range(n): exe(x)
    return (time.process_time() - t) / n * 1e6
res = {"native": [], "python": []}
with torch.no_grad():
    for r in range(8):
        for path in ("native", "python") if r % 2 == 0 else ("python", "native"):
            res[path].append(rep(exes[path]))
for path, v in res.items():
    print(path, "us/call min %.1f median %.1f" % (min(v), statistics.median(v)), ["%.1f" % a for a in v])
