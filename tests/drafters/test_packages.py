"""Drafter packages: inference code never pulls in training code."""
import subprocess
import sys


def test_importing_every_proposer_imports_no_recipe():
    code = ("import sys\n"
            "import hyspec.drafters\n"
            "for m in ('eagle', 'mtp', 'dflash', 'dspark', 'ngram', 'draft_model'):\n"
            "    __import__(f'hyspec.drafters.{m}.proposer')\n"
            "print(sorted(n for n in sys.modules if n.endswith('.recipe') or n.startswith('hyspec.train')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PATH": ""})
    assert out.stdout.strip() == "[]", out.stdout
