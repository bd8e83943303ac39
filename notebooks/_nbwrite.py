"""Write a notebook from a list of ("md" | "code", source) cells, with no outputs.

    from _nbwrite import write
    write("04_flash_torch.ipynb", [("md", "# Step 04 ..."), ("code", "x = 1")])
"""

from pathlib import Path

import nbformat


def write(name, cells):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for kind, src in cells:
        src = src.strip("\n")
        nb.cells.append(nbformat.v4.new_markdown_cell(src) if kind == "md" else nbformat.v4.new_code_cell(src))
    path = Path(__file__).resolve().parent / name
    nbformat.write(nb, path)
    return path
