
#include <torch/csrc/inductor/cpp_prefix.h>
extern "C"  void  kernel(const int64_t* in_ptr0,
                       const float* in_ptr1,
                       const int64_t* in_ptr2,
                       const int32_t* in_ptr3,
                       const int32_t* in_ptr4,
                       const int32_t* in_ptr5,
                       const int32_t* in_ptr6,
                       const float* in_ptr7,
                       float* out_ptr0,
                       bool* out_ptr1,
                       bool* out_ptr2,
                       int32_t* out_ptr3,
                       int32_t* out_ptr4,
                       int32_t* out_ptr5,
                       int32_t* out_ptr6,
                       float* out_ptr7,
                       const int64_t ks0,
                       const int64_t ks1,
                       const int64_t ks2,
                       const int64_t ks3,
                       const int64_t ks4,
                       const int64_t ks5)
{
    {
        {
            float tmp_acc0 = 0;
            at::vec::Vectorized<float> tmp_acc0_vec = at::vec::Vectorized<float>(0);
            for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(64L); x0+=static_cast<int64_t>(16L))
            {
                {
                    if(C10_LIKELY(x0 >= static_cast<int64_t>(0) && x0 < static_cast<int64_t>(64L)))
                    {
                        auto tmp0 = in_ptr0[static_cast<int64_t>(0L)];
                        auto tmp1 = 128L;
                        auto tmp2 = c10::convert<int64_t>(tmp1);
                        auto tmp3 = int64_t(tmp0 + tmp2);
                        auto tmp4 = tmp0 < 0;
                        auto tmp5 = tmp4 ? tmp3 : tmp0;
                        auto tmp6 = tmp5;
                        auto tmp7 = c10::convert<int64_t>(tmp6);
                        TORCH_CHECK((0 <= tmp7) & (tmp7 < 128L), "index out of bounds: 0 <= tmp7 < 128L");
                        auto tmp9 = at::vec::Vectorized<float>::loadu(in_ptr1 + static_cast<int64_t>(x0 + 64L*tmp5), static_cast<int64_t>(16));
                        auto tmp10 = tmp9 * tmp9;
                        tmp_acc0_vec = tmp_acc0_vec + tmp10;
                    }
                }
            }
            tmp_acc0 = tmp_acc0 + at::vec::vec_reduce_all<float, 1>([](at::vec::Vectorized<float>& x, at::vec::Vectorized<float>& y) { return x + y; }, tmp_acc0_vec);
            out_ptr0[static_cast<int64_t>(0L)] = static_cast<float>(tmp_acc0);
        }
    }
    {
        for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(1L + ks0); x0+=static_cast<int64_t>(16L))
        {
            {
                if(C10_LIKELY(x0 >= static_cast<int64_t>(0) && x0 < static_cast<int64_t>(16L*(c10::div_floor_integer(static_cast<int64_t>(1L + ks0), static_cast<int64_t>(16L))))))
                {
                    TORCH_CHECK((at::vec::VecMask<int64_t,2>(tmp2 < at::vec::VectorizedN<int64_t,2>(ks1))).all_masked(), "index out of bounds: tmp2 < ks1");
                    auto tmp13 = at::vec::VectorizedN<int64_t,2>::loadu(in_ptr2 + static_cast<int64_t>(x0), static_cast<int64_t>(16));
                    auto tmp0 = x0;
                    auto tmp1 = c10::convert<int64_t>(tmp0);
                    auto tmp2 = at::vec::VectorizedN<int64_t,2>::arange(tmp1, 1);
                    auto tmp3 = ks0;
                    auto tmp4 = c10::convert<int64_t>(tmp3);
                    auto tmp5 = at::vec::VectorizedN<int64_t,2>(tmp4);
                    auto tmp6 = at::vec::VecMask<int64_t,2>(tmp2 <= tmp5);
                    auto tmp7 = static_cast<bool>(true);
                    auto tmp8 = at::vec::VecMask<float,1>::from(tmp7);
                    auto tmp9 = tmp8.template cast<int32_t,1>();
                    auto tmp10 = tmp6.template cast<int32_t,1>();
                    auto tmp11 = tmp9 & tmp10;
                    auto tmp14 = at::vec::VecMask<int64_t,2>::from<int64_t,2>(tmp13);
                    auto tmp15 = tmp11.template cast<int32_t,1>();
                    auto tmp16 = tmp14.template cast<int32_t,1>();
                    auto tmp17 = tmp15 & tmp16;
                    tmp17.store(out_ptr1 + static_cast<int64_t>(x0), static_cast<int64_t>(16));
                    tmp17.store(out_ptr2 + static_cast<int64_t>(x0), static_cast<int64_t>(16));
                }
                if(C10_UNLIKELY(x0 >= static_cast<int64_t>(16L*(c10::div_floor_integer(static_cast<int64_t>(1L + ks0), static_cast<int64_t>(16L)))) && x0 < static_cast<int64_t>(1L + ks0)))
                {
                    TORCH_CHECK((at::vec::VecMask<int64_t,2>::set(at::vec::VecMask<int64_t,2>::from(1), (at::vec::VecMask<int64_t,2>(tmp2 < at::vec::VectorizedN<int64_t,2>(ks1))), static_cast<int64_t>(1L + ks0 + (-16L)*(c10::div_floor_integer(static_cast<int64_t>(1L + ks0), static_cast<int64_t>(16L)))))).all_masked(), "index out of bounds: tmp2 < ks1");
                    auto tmp13 = at::vec::VectorizedN<int64_t,2>::loadu(in_ptr2 + static_cast<int64_t>(x0), static_cast<int64_t>(1L + ks0 + (-16L)*(c10::div_floor_integer(static_cast<int64_t>(1L + ks0), static_cast<int64_t>(16L)))));
                    auto tmp0 = x0;
                    auto tmp1 = c10::convert<int64_t>(tmp0);
                    auto tmp2 = at::vec::VectorizedN<int64_t,2>::arange(tmp1, 1);
                    auto tmp3 = ks0;
                    auto tmp4 = c10::convert<int64_t>(tmp3);
                    auto tmp5 = at::vec::VectorizedN<int64_t,2>(tmp4);
                    auto tmp6 = at::vec::VecMask<int64_t,2>(tmp2 <= tmp5);
                    auto tmp7 = static_cast<bool>(true);
                    auto tmp8 = at::vec::VecMask<float,1>::from(tmp7);
                    auto tmp9 = tmp8.template cast<int32_t,1>();
                    auto tmp10 = tmp6.template cast<int32_t,1>();
                    auto tmp11 = tmp9 & tmp10;
                    auto tmp14 = at::vec::VecMask<int64_t,2>::from<int64_t,2>(tmp13);
                    auto tmp15 = tmp11.template cast<int32_t,1>();
                    auto tmp16 = tmp14.template cast<int32_t,1>();
                    auto tmp17 = tmp15 & tmp16;
                    tmp17.store(out_ptr1 + static_cast<int64_t>(x0), static_cast<int64_t>(1L + ks0 + (-16L)*(c10::div_floor_integer(static_cast<int64_t>(1L + ks0), static_cast<int64_t>(16L)))));
                    tmp17.store(out_ptr2 + static_cast<int64_t>(x0), static_cast<int64_t>(1L + ks0 + (-16L)*(c10::div_floor_integer(static_cast<int64_t>(1L + ks0), static_cast<int64_t>(16L)))));
                }
            }
        }
    }
    {
        #pragma GCC ivdep
        for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(2L); x0+=static_cast<int64_t>(1L))
        {
            for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(ks2); x1+=static_cast<int64_t>(16L))
            {
                {
                    if(C10_LIKELY(x1 >= static_cast<int64_t>(0) && x1 < static_cast<int64_t>(16L*(c10::div_floor_integer(static_cast<int64_t>(ks2), static_cast<int64_t>(16L))))))
                    {
                        auto tmp0 = at::vec::Vectorized<int32_t>::loadu(in_ptr3 + static_cast<int64_t>(x1 + ks2*x0), static_cast<int64_t>(16));
                        tmp0.store(out_ptr3 + static_cast<int64_t>(x0 + x1 + ks2*x0), static_cast<int64_t>(16));
                    }
                    if(C10_UNLIKELY(x1 >= static_cast<int64_t>(16L*(c10::div_floor_integer(static_cast<int64_t>(ks2), static_cast<int64_t>(16L)))) && x1 < static_cast<int64_t>(ks2)))
                    {
                        auto tmp0 = at::vec::Vectorized<int32_t>::loadu(in_ptr3 + static_cast<int64_t>(x1 + ks2*x0), static_cast<int64_t>(ks2 + (-16L)*(c10::div_floor_integer(static_cast<int64_t>(ks2), static_cast<int64_t>(16L)))));
                        tmp0.store(out_ptr3 + static_cast<int64_t>(x0 + x1 + ks2*x0), static_cast<int64_t>(ks2 + (-16L)*(c10::div_floor_integer(static_cast<int64_t>(ks2), static_cast<int64_t>(16L)))));
                    }
                }
            }
        }
    }
    {
        #pragma GCC ivdep
        for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(2L); x0+=static_cast<int64_t>(1L))
        {
            for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(ks3); x1+=static_cast<int64_t>(16L))
            {
                {
                    if(C10_LIKELY(x1 >= static_cast<int64_t>(0) && x1 < static_cast<int64_t>(16L*(c10::div_floor_integer(static_cast<int64_t>(ks3), static_cast<int64_t>(16L))))))
                    {
                        auto tmp0 = at::vec::Vectorized<int32_t>::loadu(in_ptr4 + static_cast<int64_t>(x1 + ks3*x0), static_cast<int64_t>(16));
                        tmp0.store(out_ptr4 + static_cast<int64_t>(x0 + x1 + ks3*x0), static_cast<int64_t>(16));
                    }
                    if(C10_UNLIKELY(x1 >= static_cast<int64_t>(16L*(c10::div_floor_integer(static_cast<int64_t>(ks3), static_cast<int64_t>(16L)))) && x1 < static_cast<int64_t>(ks3)))
                    {
                        auto tmp0 = at::vec::Vectorized<int32_t>::loadu(in_ptr4 + static_cast<int64_t>(x1 + ks3*x0), static_cast<int64_t>(ks3 + (-16L)*(c10::div_floor_integer(static_cast<int64_t>(ks3), static_cast<int64_t>(16L)))));
                        tmp0.store(out_ptr4 + static_cast<int64_t>(x0 + x1 + ks3*x0), static_cast<int64_t>(ks3 + (-16L)*(c10::div_floor_integer(static_cast<int64_t>(ks3), static_cast<int64_t>(16L)))));
                    }
                }
            }
        }
    }
    {
        #pragma GCC ivdep
        for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(2L); x0+=static_cast<int64_t>(1L))
        {
            for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(ks4); x1+=static_cast<int64_t>(16L))
            {
                {
                    if(C10_LIKELY(x1 >= static_cast<int64_t>(0) && x1 < static_cast<int64_t>(16L*(c10::div_floor_integer(static_cast<int64_t>(ks4), static_cast<int64_t>(16L))))))
                    {
                        auto tmp0 = at::vec::Vectorized<int32_t>::loadu(in_ptr5 + static_cast<int64_t>(x1 + ks4*x0), static_cast<int64_t>(16));
                        tmp0.store(out_ptr5 + static_cast<int64_t>(x0 + x1 + ks4*x0), static_cast<int64_t>(16));
                    }
                    if(C10_UNLIKELY(x1 >= static_cast<int64_t>(16L*(c10::div_floor_integer(static_cast<int64_t>(ks4), static_cast<int64_t>(16L)))) && x1 < static_cast<int64_t>(ks4)))
                    {
                        auto tmp0 = at::vec::Vectorized<int32_t>::loadu(in_ptr5 + static_cast<int64_t>(x1 + ks4*x0), static_cast<int64_t>(ks4 + (-16L)*(c10::div_floor_integer(static_cast<int64_t>(ks4), static_cast<int64_t>(16L)))));
                        tmp0.store(out_ptr5 + static_cast<int64_t>(x0 + x1 + ks4*x0), static_cast<int64_t>(ks4 + (-16L)*(c10::div_floor_integer(static_cast<int64_t>(ks4), static_cast<int64_t>(16L)))));
                    }
                }
            }
        }
    }
    {
        #pragma GCC ivdep
        for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(2L); x0+=static_cast<int64_t>(1L))
        {
            for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(ks5); x1+=static_cast<int64_t>(16L))
            {
                {
                    if(C10_LIKELY(x1 >= static_cast<int64_t>(0) && x1 < static_cast<int64_t>(16L*(c10::div_floor_integer(static_cast<int64_t>(ks5), static_cast<int64_t>(16L))))))
                    {
                        auto tmp0 = at::vec::Vectorized<int32_t>::loadu(in_ptr6 + static_cast<int64_t>(x1 + ks5*x0), static_cast<int64_t>(16));
                        tmp0.store(out_ptr6 + static_cast<int64_t>(x0 + x1 + ks5*x0), static_cast<int64_t>(16));
                    }
                    if(C10_UNLIKELY(x1 >= static_cast<int64_t>(16L*(c10::div_floor_integer(static_cast<int64_t>(ks5), static_cast<int64_t>(16L)))) && x1 < static_cast<int64_t>(ks5)))
                    {
                        auto tmp0 = at::vec::Vectorized<int32_t>::loadu(in_ptr6 + static_cast<int64_t>(x1 + ks5*x0), static_cast<int64_t>(ks5 + (-16L)*(c10::div_floor_integer(static_cast<int64_t>(ks5), static_cast<int64_t>(16L)))));
                        tmp0.store(out_ptr6 + static_cast<int64_t>(x0 + x1 + ks5*x0), static_cast<int64_t>(ks5 + (-16L)*(c10::div_floor_integer(static_cast<int64_t>(ks5), static_cast<int64_t>(16L)))));
                    }
                }
            }
        }
    }
    {
        for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(64L); x0+=static_cast<int64_t>(16L))
        {
            {
                if(C10_LIKELY(x0 >= static_cast<int64_t>(0) && x0 < static_cast<int64_t>(64L)))
                {
                    auto tmp0 = at::vec::Vectorized<float>::loadu(in_ptr7 + static_cast<int64_t>(x0), static_cast<int64_t>(16));
                    auto tmp1 = in_ptr0[static_cast<int64_t>(0L)];
                    auto tmp11 = out_ptr0[static_cast<int64_t>(0L)];
                    auto tmp2 = 128L;
                    auto tmp3 = c10::convert<int64_t>(tmp2);
                    auto tmp4 = int64_t(tmp1 + tmp3);
                    auto tmp5 = tmp1 < 0;
                    auto tmp6 = tmp5 ? tmp4 : tmp1;
                    auto tmp7 = tmp6;
                    auto tmp8 = c10::convert<int64_t>(tmp7);
                    TORCH_CHECK((0 <= tmp8) & (tmp8 < 128L), "index out of bounds: 0 <= tmp8 < 128L");
                    auto tmp10 = at::vec::Vectorized<float>::loadu(in_ptr1 + static_cast<int64_t>(x0 + 64L*tmp6), static_cast<int64_t>(16));
                    auto tmp12 = static_cast<float>(64.0);
                    auto tmp13 = tmp11 / tmp12;
                    auto tmp14 = static_cast<float>(1e-06);
                    auto tmp15 = float(tmp13 + tmp14);
                    auto tmp16 = 1 / std::sqrt(tmp15);
                    auto tmp17 = at::vec::Vectorized<float>(tmp16);
                    auto tmp18 = tmp10 * tmp17;
                    auto tmp19 = tmp0 * tmp18;
                    tmp19.store(out_ptr7 + static_cast<int64_t>(x0));
                }
            }
        }
    }
}

// Python bindings to call kernel():
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <sstream>
#include <cstdlib>
#include <cerrno>

#ifndef _MSC_VER
#if __cplusplus < 202002L
// C++20 (earlier) code
// https://en.cppreference.com/w/cpp/language/attributes/likely
#define likely(x)       __builtin_expect(!!(x), 1)
#define unlikely(x)     __builtin_expect(!!(x), 0)
#endif
#else
#define likely(x) (x)
#define unlikely(x) (x)
#endif

// This is defined in guards.cpp so we don't need to import PyTorch headers that are slooow.
// We manually link it below to workaround issues with fbcode build.
static void* (*_torchinductor_pyobject_tensor_data_ptr)(PyObject* obj);

template <typename T> static inline T parse_arg(PyObject* args, size_t n) {
    static_assert(std::is_pointer_v<T>, "arg type must be pointer or long");
    return static_cast<T>(_torchinductor_pyobject_tensor_data_ptr(PyTuple_GET_ITEM(args, n)));
}
template <> inline int64_t parse_arg<int64_t>(PyObject* args, size_t n) {
    auto result = PyLong_AsSsize_t(PyTuple_GET_ITEM(args, n));
    if(unlikely(result == -1 && PyErr_Occurred()))
        throw std::runtime_error("expected int arg");
    return result;
}
template <> inline uintptr_t parse_arg<uintptr_t>(PyObject* args, size_t n) {
    auto result = PyLong_AsVoidPtr(PyTuple_GET_ITEM(args, n));
    if(unlikely(result == reinterpret_cast<void*>(-1) && PyErr_Occurred()))
        throw std::runtime_error("expected int arg");
    return reinterpret_cast<uintptr_t>(result);
}
template <> inline float parse_arg<float>(PyObject* args, size_t n) {
    auto result = PyFloat_AsDouble(PyTuple_GET_ITEM(args, n));
    if(unlikely(result == -1.0 && PyErr_Occurred()))
        throw std::runtime_error("expected float arg");
    return static_cast<float>(result);
}



static PyObject* kernel_py(PyObject* self, PyObject* args) {
    try {
        if(unlikely(!PyTuple_CheckExact(args)))
            throw std::runtime_error("tuple args required");
        if(unlikely(PyTuple_GET_SIZE(args) != 22))
            throw std::runtime_error("requires 22 args");
        kernel(parse_arg<int64_t*>(args, 0), parse_arg<float*>(args, 1), parse_arg<int64_t*>(args, 2), parse_arg<int32_t*>(args, 3), parse_arg<int32_t*>(args, 4), parse_arg<int32_t*>(args, 5), parse_arg<int32_t*>(args, 6), parse_arg<float*>(args, 7), parse_arg<float*>(args, 8), parse_arg<bool*>(args, 9), parse_arg<bool*>(args, 10), parse_arg<int32_t*>(args, 11), parse_arg<int32_t*>(args, 12), parse_arg<int32_t*>(args, 13), parse_arg<int32_t*>(args, 14), parse_arg<float*>(args, 15), parse_arg<int64_t>(args, 16), parse_arg<int64_t>(args, 17), parse_arg<int64_t>(args, 18), parse_arg<int64_t>(args, 19), parse_arg<int64_t>(args, 20), parse_arg<int64_t>(args, 21)); Py_RETURN_NONE;
    } catch(std::exception const& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
        return nullptr;
    } catch(...) {
        PyErr_SetString(PyExc_RuntimeError, "unhandled error");
        return nullptr;
    }
}

static PyMethodDef py_methods[] = {
    {"kernel", kernel_py, METH_VARARGS, ""},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef py_module =
    {PyModuleDef_HEAD_INIT, "kernel", NULL, -1, py_methods};

PyMODINIT_FUNC PyInit_kernel(void) {
    const char* str_addr = std::getenv("_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR");
    if(!str_addr) {
        PyErr_SetString(PyExc_RuntimeError, "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR must be set");
        return nullptr;
    }

    char* endptr = nullptr;
    errno = 0;
    uintptr_t addr = std::strtoull(str_addr, &endptr, 10);
    if(errno != 0 || endptr == str_addr || addr == 0) {
        PyErr_SetString(PyExc_RuntimeError, "Failed to parse _TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR");
        return nullptr;
    }
    _torchinductor_pyobject_tensor_data_ptr =
        reinterpret_cast<decltype(_torchinductor_pyobject_tensor_data_ptr)>(addr);
    PyObject* module = PyModule_Create(&py_module);
    if (module == NULL) {
        return NULL;
    }
    #ifdef Py_GIL_DISABLED
        PyUnstable_Module_SetGIL(module, Py_MOD_GIL_NOT_USED);
    #endif
    return module;
}
