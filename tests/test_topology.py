"""CPU masks are derived from the topology table, and match shared/LUMI.md."""

from __future__ import annotations

from hpclaunch.config.profiles import load_profile
from hpclaunch.config.topology import Topology, map_cpu_bind, mask, mask_cpu_bind, parse_cpu_list

# Copied from shared/LUMI.md ("GCD -> CPU binding"), GCD 0..7.
LUMI_MASKS = (
    "0x00fe000000000000,0xfe00000000000000,0x0000000000fe0000,0x00000000fe000000,"
    "0x00000000000000fe,0x000000000000fe00,0x000000fe00000000,0x0000fe0000000000"
)
LUMI_MAP = "49,57,17,25,1,9,33,41"


def test_lumi_profile_topology_gives_the_documented_masks() -> None:
    topo = load_profile("lumi").topology
    assert topo is not None
    assert mask_cpu_bind(topo) == "verbose,mask_cpu:" + LUMI_MASKS
    assert map_cpu_bind(topo, verbose=False) == "map_cpu:" + LUMI_MAP


def test_lumi_cores_are_the_documented_ranges() -> None:
    topo = load_profile("lumi").topology
    assert topo is not None
    expected = ["49-55", "57-63", "17-23", "25-31", "1-7", "9-15", "33-39", "41-47"]
    assert topo.cores() == [parse_cpu_list(r) for r in expected]


def test_explicit_gpu_cores_table() -> None:
    topo = Topology(gpu_cores=("0-3", "4-7", "64-67"))
    assert topo.gpus == 3
    assert mask(topo.cores()[0]) == "0x000000000000000f"
    # A core above 63 widens the mask to 128 bits, and every mask of the bind list with it.
    assert mask(topo.cores()[2]) == "0x" + "000000000000000f" + "0" * 16
    masks = mask_cpu_bind(topo, verbose=False).split(":", 1)[1].split(",")
    assert [len(m) for m in masks] == [34, 34, 34]
