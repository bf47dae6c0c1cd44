"""Image classification data: the image data modules (arrays, class folders, CIFAR, MNIST, digits, ImageNet), their
transforms, and decoding on the CPU or the GPU."""
