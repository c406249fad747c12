import time, torch, fpsim, sys
sys.path.insert(0, "tests")
from test_training_presets import train
torch.set_num_threads(1)
for i in range(3):
    l,_=train("nvfp4", steps=3); print(l)
