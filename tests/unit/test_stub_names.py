"""Host stub symbols of nvcc 13 builds (tests/fixtures/shapes/, read with nm)
matched to the kernels of their file's fatbin, and the display form of
mangled names (c++filt)."""

from __future__ import annotations

import shutil

import pytest

from pasta_trace.capture.naming.stub_names import external_name, kernel_of_symbol
from pasta_trace.demangle import display_names, short_form

#: libshapes_a.so, libshapes_b.so and shapes_main: every kernel of their fatbins
KERNELS = frozenset({
    "_Z12local_kernelPi", "_Z5applyI5TwiceLi4EEvPi", "_Z9same_namePi", "_ZN5outer5inner4fillEPii", "c_kernel",
    "_ZN44_GLOBAL__N__7070b209_11_shapes_a_cu_8bd3e4826hiddenEPi", "_ZN6b_only4stepILi3EEEvPf",
    "_Z4eachIZ4mainEUliE_EvT_i", "_ZN2ns5scaleIfEEvPT_S1_i",
})


def test_internal_linkage_marker():
    assert {s: external_name(s) for s in [
        "_ZN2nsL5scaleIfEEvPT_S1_i", "_ZL12local_kernelPi", "_ZN6b_onlyL4stepILi3EEEvPf",
        "_Z5applyI5TwiceLi4EEvPi",  # Li4E: a literal, kept
        "_ZNK1A1fEv", "c_kernel", "_ZN2ns1fILi3EEEvv",
    ]} == {
        "_ZN2nsL5scaleIfEEvPT_S1_i": "_ZN2ns5scaleIfEEvPT_S1_i",
        "_ZL12local_kernelPi": "_Z12local_kernelPi",
        "_ZN6b_onlyL4stepILi3EEEvPf": "_ZN6b_only4stepILi3EEEvPf",
        "_Z5applyI5TwiceLi4EEvPi": "_Z5applyI5TwiceLi4EEvPi",
        "_ZNK1A1fEv": "_ZNK1A1fEv",
        "c_kernel": "c_kernel",
        "_ZN2ns1fILi3EEEvv": "_ZN2ns1fILi3EEEvv",
    }


def test_stubs_of_every_shape_name_their_kernel():
    """The symbols a launch handle or its caller falls in, as nm lists them."""
    cases = {
        "_ZN2nsL5scaleIfEEvPT_S1_i": "_ZN2ns5scaleIfEEvPT_S1_i",  # a template in a namespace
        "_ZL12local_kernelPi": "_Z12local_kernelPi",  # static
        "_ZN6b_onlyL4stepILi3EEEvPf": "_ZN6b_only4stepILi3EEEvPf",  # over an int
        "_Z5applyI5TwiceLi4EEvPi": "_Z5applyI5TwiceLi4EEvPi",  # over a functor and an int
        "_ZN5outer5inner4fillEPii": "_ZN5outer5inner4fillEPii",
        "_ZN44_GLOBAL__N__7070b209_11_shapes_a_cu_8bd3e4826hiddenEPi":
            "_ZN44_GLOBAL__N__7070b209_11_shapes_a_cu_8bd3e4826hiddenEPi",
        "c_kernel": "c_kernel",
        "_ZL38__device_stub__ZN2ns5scaleIfEEvPT_S1_iPffi": "_ZN2ns5scaleIfEEvPT_S1_i",
        "_ZL32__device_stub__Z12local_kernelPiPi": "_Z12local_kernelPi",
        "_Z27__device_stub__Z8c_kernelPiPi": "c_kernel",
        # an extended lambda: the stub is over nvcc's wrapper, the fatbin over the closure
        "_Z4eachI17__nv_dl_wrapper_tI11__nv_dl_tagIPFiiPPcEXadL_Z4mainEELj1EEJPiEEEvT_i":
            "_Z4eachIZ4mainEUliE_EvT_i",
        "main": None,
        "_ZN2nsL5otherIfEEvPT_S1_i": None,
    }
    assert {s: kernel_of_symbol(s, KERNELS) for s in cases} == cases


def test_lambda_stub_needs_one_kernel_of_its_template():
    """Two instances of the template in the fatbin: the stub names neither."""
    two = KERNELS | {"_Z4eachIZ4mainEUliE0_EvT_i"}
    stub = "_Z4eachI17__nv_dl_wrapper_tI11__nv_dl_tagIPFiiPPcEXadL_Z4mainEELj1EEJPiEEEvT_i"
    assert kernel_of_symbol(stub, two) is None


def test_short_form():
    assert [short_form(d) for d in [
        "void ns::scale<float>(float*, float, int)", "(anonymous namespace)::hidden(int*)",
        "void each<main::{lambda(int)#1}>(main::{lambda(int)#1}, int)", "void apply<Twice, 4>(int*)",
        "cutlass::Kernel<cutlass::gemm::kernel::Gemm<int> >", "c_kernel",
    ]] == ["ns::scale<float>", "(anonymous namespace)::hidden", "each<main::{lambda(int)#1}>", "apply<Twice, 4>",
           "cutlass::Kernel<cutlass::gemm::kernel::Gemm<int> >", "c_kernel"]


@pytest.mark.skipif(shutil.which("c++filt") is None, reason="binutils' c++filt is not installed")
def test_display_names():
    assert display_names(sorted(KERNELS) + ["unknown@0x1234", "c_kernel"]) == {
        "_Z12local_kernelPi": "local_kernel",
        "_Z4eachIZ4mainEUliE_EvT_i": "each<main::{lambda(int)#1}>",
        "_Z5applyI5TwiceLi4EEvPi": "apply<Twice, 4>",
        "_Z9same_namePi": "same_name",
        "_ZN2ns5scaleIfEEvPT_S1_i": "ns::scale<float>",
        "_ZN44_GLOBAL__N__7070b209_11_shapes_a_cu_8bd3e4826hiddenEPi": "(anonymous namespace)::hidden",
        "_ZN5outer5inner4fillEPii": "outer::inner::fill",
        "_ZN6b_only4stepILi3EEEvPf": "b_only::step<3>",
        "c_kernel": "c_kernel",
        "unknown@0x1234": "unknown@0x1234",
    }
