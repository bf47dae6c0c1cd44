"""How image data is stored: LitData shards (written, checked, read) and ImageNet as image-net.org ships it."""
