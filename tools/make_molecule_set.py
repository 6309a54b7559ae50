"""Write graphkern/bench/data/nci1000.sdf.gz: 1000 NCI molecules with 3D coordinates and properties.

Source: the first 5000 NCI structures shipped with RDKit (rdkit/Data/NCI/first_5K.smi,
BSD-licensed RDKit data; NCI structures are public).  Each molecule gets hydrogens,
an ETKDG 3D embedding (fixed seed) and three RDKit-computed properties used as
regression targets: TPSA, MolLogP, MolWt.  Run once with RDKit installed:

    python tools/make_molecule_set.py [N]
"""

import gzip
import os
import sys

from rdkit import Chem, RDConfig
from rdkit.Chem import AllChem, Descriptors

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
src = os.path.join(RDConfig.RDDataDir, "NCI", "first_5K.smi")
out = os.path.join(os.path.dirname(__file__), "..", "graphkern", "bench", "data", f"nci{N}.sdf.gz")
params = AllChem.ETKDGv3()
params.randomSeed = 42
written = 0
with open(src) as fh, gzip.open(out, "wt") as gz:
    for line in fh:
        smi, ident = line.split()[:2]
        mol = Chem.MolFromSmiles(smi)
        if mol is None or mol.GetNumAtoms() < 3 or "." in smi:
            continue
        mol = Chem.AddHs(mol)
        params.timeout = 10
        try:
            if AllChem.EmbedMolecule(mol, params) != 0:
                continue
        except RuntimeError:  # RDKit invariant violations on odd inorganics: skip the molecule
            continue
        mol.SetProp("_Name", f"NCI-{ident}")
        gz.write(Chem.MolToMolBlock(mol, forceV3000=False))
        for key, value in (("TPSA", Descriptors.TPSA(mol)), ("MolLogP", Descriptors.MolLogP(mol)),
                           ("MolWt", Descriptors.MolWt(mol))):
            gz.write(f">  <{key}>\n{value:.4f}\n\n")
        gz.write("$$$$\n")
        written += 1
        if written == N:
            break
print(f"wrote {written} molecules to {out}")
