"""The torchvision models bench/gpu/run exports and checks against, built the
same way in every process (the exporter's children and the parity
reference).

Random weights with BatchNorm's default running statistics (mean 0,
variance 1) shrink the activations layer by layer: mobilenet_v2's logits
come out near 1e-9 and efficientnet_b0's near 1e-14, below FP16's smallest
number, so any FP16 engine answers zeros and a parity check measures
nothing. A trained network keeps its activations near unit scale; so do
these once BatchNorm's statistics are measured on a few random batches (in
train mode, cumulative averages), which is what build() does. Models
without BatchNorm (vit_b_16, convnext_tiny) are as torchvision makes them."""


def build(name):
    """torchvision's `name`, random weights (seed 0), BatchNorm calibrated,
    in eval mode, on the CPU. "segmentation.X" is torchvision's segmenter X
    with its dict's "out" as its one output ([N, 21, 224, 224]): its
    bilinear upsampling is a Resize, which the cuda backend's own kernel
    runs."""
    import torch
    import torchvision
    torch.manual_seed(0)
    if name.startswith("segmentation."):
        seg = getattr(torchvision.models.segmentation, name.split(".", 1)[1])(
            weights=None, weights_backbone=None)

        class OutOnly(torch.nn.Module):
            def __init__(self, model):
                super().__init__()
                self.model = model

            def forward(self, x):
                return self.model(x)["out"]

        m = OutOnly(seg)
    else:
        m = getattr(torchvision.models, name)(weights=None)
    bns = [x for x in m.modules() if isinstance(x, torch.nn.modules.batchnorm._BatchNorm)]
    if bns:
        threads = torch.get_num_threads()
        torch.set_num_threads(2)  # the same sums in every process
        for b in bns:
            b.reset_running_stats()
            b.momentum = None  # a cumulative average over the batches
        m.train()
        g = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for _ in range(2):
                m(torch.randn(8, 3, 224, 224, generator=g))
        torch.set_num_threads(threads)
    return m.eval()
