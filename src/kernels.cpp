#include "kernels.hpp"
