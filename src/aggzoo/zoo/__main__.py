"""``python -m aggzoo.zoo [pattern]``: the registered weights as a Markdown table (name, descriptor
size, input size, source, licence, recorded R@1)."""

import sys

from aggzoo.registry import pretrained_table

print(pretrained_table(sys.argv[1] if len(sys.argv) > 1 else "*"))
