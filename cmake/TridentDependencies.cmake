# Finds every library trident needs and turns each into one imported target, with an
# error that names the Debian package when something is missing (`make deps` installs all).

macro(trident_need found what package)
  if(NOT ${found})
    message(FATAL_ERROR "trident: ${what} not found. Install the Debian package '${package}' "
                        "(or run 'make deps', which installs everything trident needs).")
  endif()
endmacro()

find_package(MPI COMPONENTS C CXX)
trident_need(MPI_CXX_FOUND "MPI (C++ bindings of Open MPI)" "libopenmpi-dev openmpi-bin")

find_package(OpenMP)
trident_need(OpenMP_CXX_FOUND "OpenMP" "g++ (libgomp)")

# Parallel HDF5: collective checkpoint writes need the MPI-IO driver, so the serial
# build is refused rather than silently used.
set(HDF5_PREFER_PARALLEL TRUE)
find_package(HDF5 COMPONENTS C)
trident_need(HDF5_FOUND "HDF5" "libhdf5-openmpi-dev")
if(NOT HDF5_IS_PARALLEL)
  message(FATAL_ERROR "trident: the HDF5 found (${HDF5_C_INCLUDE_DIRS}) is the serial build; "
                      "trident needs parallel HDF5. Install 'libhdf5-openmpi-dev' and, if "
                      "several HDF5 builds are installed, point HDF5_ROOT at the MPI one.")
endif()
add_library(trident::hdf5 INTERFACE IMPORTED)
target_include_directories(trident::hdf5 SYSTEM INTERFACE ${HDF5_C_INCLUDE_DIRS})
target_link_libraries(trident::hdf5 INTERFACE ${HDF5_C_LIBRARIES} MPI::MPI_C)
target_compile_definitions(trident::hdf5 INTERFACE ${HDF5_C_DEFINITIONS})

# OpenBLAS (its CBLAS header and openblas_set_num_threads).
find_path(OPENBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas x86_64-linux-gnu/openblas-pthread
          x86_64-linux-gnu aarch64-linux-gnu/openblas-pthread aarch64-linux-gnu)
find_library(OPENBLAS_LIBRARY NAMES openblas)
trident_need(OPENBLAS_LIBRARY "OpenBLAS" "libopenblas-dev")
trident_need(OPENBLAS_INCLUDE_DIR "cblas.h (OpenBLAS)" "libopenblas-dev")
add_library(trident::blas INTERFACE IMPORTED)
target_include_directories(trident::blas SYSTEM INTERFACE ${OPENBLAS_INCLUDE_DIR})
target_link_libraries(trident::blas INTERFACE ${OPENBLAS_LIBRARY})

find_package(tomlplusplus CONFIG QUIET)
trident_need(tomlplusplus_FOUND "toml++" "libtomlplusplus-dev")
find_package(CLI11 CONFIG QUIET)
trident_need(CLI11_FOUND "CLI11" "libcli11-dev")
find_package(nlohmann_json 3 CONFIG QUIET)  # prepare-data's JSON Lines input
trident_need(nlohmann_json_FOUND "nlohmann JSON" "nlohmann-json3-dev")

find_package(PkgConfig)
trident_need(PKG_CONFIG_FOUND "pkg-config" "pkg-config")
pkg_check_modules(SENTENCEPIECE IMPORTED_TARGET sentencepiece)
trident_need(SENTENCEPIECE_FOUND "SentencePiece" "libsentencepiece-dev")
find_library(SENTENCEPIECE_TRAIN_LIBRARY NAMES sentencepiece_train)
trident_need(SENTENCEPIECE_TRAIN_LIBRARY "SentencePiece trainer library" "libsentencepiece-dev")
add_library(trident::sentencepiece INTERFACE IMPORTED)
target_link_libraries(trident::sentencepiece INTERFACE PkgConfig::SENTENCEPIECE ${SENTENCEPIECE_TRAIN_LIBRARY})
# GPT-2's tokenizer: ICU's Unicode letter/number/space tables, OpenSSL's SHA-256 of its files.
pkg_check_modules(ICU IMPORTED_TARGET icu-uc)
trident_need(ICU_FOUND "ICU (icu-uc)" "libicu-dev")
pkg_check_modules(LIBCRYPTO IMPORTED_TARGET libcrypto)
trident_need(LIBCRYPTO_FOUND "OpenSSL libcrypto" "libssl-dev")

find_package(GTest)
trident_need(GTest_FOUND "GoogleTest" "libgtest-dev")
