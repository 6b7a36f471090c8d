// symlib.cpp - C++ functions whose demangled names tests/unit/test_elfsym.c
// expects: gg_test::cxx_fn(int), int gg_test::twice<int>(int),
// gg_test::Box::get() const. It uses std::string, so loading it brings
// libstdc++ (and its __cxa_demangle) in, RTLD_LOCAL like under Python.
#include <string>

namespace gg_test {

std::string label(int x)
{
    return "box " + std::to_string(x);
}

int cxx_fn(int x)
{
    return x + 2;
}

template <typename T> T twice(T x)
{
    return x + x;
}
template int twice<int>(int);

struct Box {
    int v;
    int get() const;
};

int Box::get() const
{
    return v;
}

}  // namespace gg_test
