# Finding LLVM and Clang 16 for the in-process CPU compiler (jit/compiler_llvm.cpp).
#
# The version is pinned and the search is confined to the LLVM 16 prefix because Debian
# installs LLVM 14 next to 16, and an unpinned find_package happily mixes the two (LLVM
# from one, Clang from the other). Point KILN_LLVM16_PREFIX (or LLVM_DIR / Clang_DIR) at
# another installation when it lives elsewhere.
set(KILN_LLVM16_PREFIX "/usr/lib/llvm-16" CACHE PATH "Prefix of the LLVM/Clang 16 installation")

# LLVMConfig.cmake probes libffi and terminfo with check_c_source_compiles, which fails in
# a CXX-only project. Those libraries only matter when linking LLVM's static components;
# kiln links the shared libLLVM, so the checks are answered here (a defined result
# variable makes the check a no-op). Called inside the functions below, so it stays local.
macro(_kiln_skip_llvm_c_checks)
  set(HAVE_FFI_CALL 1)
  set(Terminfo_LINKABLE 1)
endmacro()

# Sets <out_var> to TRUE when both LLVM 16 and Clang 16 CMake packages are present. Used to
# choose the default of KILN_WITH_LLVM; finds quietly and defines nothing else of note.
function(kiln_probe_llvm16 out_var)
  if(DEFINED KILN_WITH_LLVM)  # chosen already (cache or -D): nothing to probe
    set(${out_var} ${KILN_WITH_LLVM} PARENT_SCOPE)
    return()
  endif()
  _kiln_skip_llvm_c_checks()
  find_package(LLVM 16 QUIET CONFIG HINTS "${KILN_LLVM16_PREFIX}/lib/cmake/llvm" NO_DEFAULT_PATH)
  set(found FALSE)
  if(LLVM_FOUND AND LLVM_VERSION_MAJOR EQUAL 16)
    find_package(Clang QUIET CONFIG HINTS "${KILN_LLVM16_PREFIX}/lib/cmake/clang" NO_DEFAULT_PATH)
    if(Clang_FOUND)
      set(found TRUE)
    endif()
  endif()
  set(${out_var} ${found} PARENT_SCOPE)
endfunction()

# Links LLVM 16 and Clang 16 (their shared libraries, libLLVM-16.so and libclang-cpp.so,
# which keeps kiln's link short) privately into <target>, and gives only <source> (the one
# file that includes their headers) the include path and definitions.
function(kiln_use_llvm16 target source)
  _kiln_skip_llvm_c_checks()
  find_package(LLVM 16 REQUIRED CONFIG HINTS "${KILN_LLVM16_PREFIX}/lib/cmake/llvm" NO_DEFAULT_PATH)
  find_package(Clang REQUIRED CONFIG HINTS "${KILN_LLVM16_PREFIX}/lib/cmake/clang" NO_DEFAULT_PATH)
  if(NOT LLVM_VERSION_MAJOR EQUAL 16)
    message(FATAL_ERROR "kiln needs LLVM 16, found ${LLVM_PACKAGE_VERSION} in ${LLVM_DIR}")
  endif()
  if(NOT TARGET LLVM OR NOT TARGET clang-cpp)
    message(FATAL_ERROR "LLVM 16 at ${LLVM_DIR} lacks the shared libLLVM / libclang-cpp "
                        "libraries kiln links; build with -DKILN_WITH_LLVM=OFF")
  endif()
  message(STATUS "kiln: in-process CPU compiler with LLVM ${LLVM_PACKAGE_VERSION} (${LLVM_DIR})")
  # -isystem (a source property has no SYSTEM flag): LLVM's headers are not warning-clean
  # under -Wall -Wextra with GCC.
  separate_arguments(options UNIX_COMMAND "${LLVM_DEFINITIONS}")
  set(dirs ${LLVM_INCLUDE_DIRS} ${CLANG_INCLUDE_DIRS})
  list(REMOVE_DUPLICATES dirs)
  foreach(dir IN LISTS dirs)
    list(APPEND options -isystem ${dir})
  endforeach()
  set_source_files_properties(${source} TARGET_DIRECTORY ${target} PROPERTIES
    COMPILE_OPTIONS "${options}")
  target_link_libraries(${target} PRIVATE clang-cpp LLVM)
endfunction()
