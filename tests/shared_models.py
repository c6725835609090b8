"""Models written once for both frameworks, shared by tests in several folders and benchmarks.

Each takes the ``nn`` namespace it builds with (``torch.nn`` or ``jm.nn``), so one definition
gives the PyTorch reference and the jmodule model with the same structure and state names.
"""

import jmodule as jm

WIDTHS = (16, 32, 64, 128)  # torchvision: (64, 128, 256, 512)


def resnet18(nn, num_classes=10, widths=WIDTHS):
    """torchvision's ResNet-18, written once; ``nn`` is ``torch.nn`` or ``jm.nn``.

    ``widths``: the four stages' channels (torchvision's: ``(64, 128, 256, 512)``;
    ``benchmarks/conv.py`` builds that one).
    """

    class BasicBlock(nn.Module):
        def __init__(self, inplanes, planes, stride=1):
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = None
            if stride != 1 or inplanes != planes:
                self.downsample = nn.Sequential(
                    nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
                )

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + identity)

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, widths[0], 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(widths[0])
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            inplanes, layers = widths[0], []
            for i, planes in enumerate(widths):
                stride = 1 if i == 0 else 2
                layers.append(
                    nn.Sequential(BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes))
                )
                inplanes = planes
            self.layer1, self.layer2, self.layer3, self.layer4 = layers
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(widths[-1], num_classes)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.avgpool(x).reshape(x.shape[0], -1))

    return ResNet()


class ResidualBlock(jm.nn.Module):
    """``x + Linear(LayerNorm(x))``: a block that ``jm.nn.scan`` can stack."""

    def __init__(self, d):
        super().__init__()
        self.ln = jm.nn.LayerNorm(d)
        self.fc = jm.nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(self.ln(x))
